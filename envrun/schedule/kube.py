"""The run as a Kubernetes job (pure rendering): a Volcano ``Job`` or a KubeRay ``RayJob``, each with the
``ConfigMap`` that carries the job to its pods. Nothing here talks to a cluster: the manifests are written,
and submitted by whoever holds the cluster's credentials.

What every pod of both kinds gets:

- the job (:mod:`.jobdir`'s ``job.json`` and envrun's own code, which the locked image does not hold) in
  the ``ConfigMap`` ``<name>-envrun`` (``job.json`` as text, ``code.zip`` as binary), under Kubernetes'
  1 MiB limit for a ConfigMap's data, mounted read-only at ``/opt/envrun/bundle``;
- an ``emptyDir`` at ``/opt/envrun/job`` (``JOB_DIR``, the same path as a Slurm job's), filled by a first
  init container ``envrun-unpack`` (the locked image's ``python3``, standard library only): the code under
  ``code/``, the spec as ``job.json``;
- a second init container ``envrun-check``: the node's own check (:mod:`envrun.injob.node`: the lock its
  image records is the run's, it sees the NPUs the run needs), with the NPUs asked as the node's main
  container asks them, so that it sees the devices the node will run on. A refusing node fails before any
  Ray starts, with its one line in ``kubectl logs POD -c envrun-check``;
- who the node is (:mod:`envrun.injob.spec`) from the downward API: its pod's name and IP, HCCL's address
  (``HCCL_IF_IP``, the pod's IP), and ``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1`` (verl's
  workers choose their NPUs, Ray must not narrow them);
- the job's environment as written (each ``$`` doubled: the kubelet would expand ``$(NAME)`` and
  make ``$$`` one ``$``);
- the run's volumes as ``hostPath`` volumes (``type: Directory``: a missing host directory fails the
  pod's start instead of being made empty), read-only unless ``rw``, in the containers that run the job.

**Volcano** (``batch.volcano.sh/v1alpha1`` ``Job``, Volcano >= 1.13 for its ``ray`` plugin): tasks
``head`` (one pod) and ``worker`` (the others), gang-scheduled (``minAvailable`` = every node). Each pod's
container ``envrun`` runs ``python3 -m envrun.injob node`` — the node's check, then its own ``ray start``
(the head: then the driver, whose exit status is the run's). The ``ray`` plugin
(``pkg/controllers/job/plugins/distributed-framework/ray/ray.go``) replaces the command of the container
named ``head`` in task ``head`` and ``worker`` in task ``worker`` with a bare ``ray start`` (no NPU resource,
no node address, no check); the container is named ``envrun`` so that it keeps its own command, while the
plugin still makes the Service ``<name>-head-svc`` for the head's GCS, dashboard and client ports (its
``targetPort``\\ s are the port *names* ``gcs``, ``dashboard`` and ``client-server``, which the head's
container declares). The ``svc`` plugin gives every pod the hostname ``<pod>`` under the subdomain
``<name>`` (a headless Service): the workers find the head at ``<name>-head-0.<name>``. The ``env`` plugin
gives every container, init containers too, ``VC_TASK_INDEX`` (the pod's index in its task): worker ``i``
is node ``i + 1``. When the head's pod succeeds (``TaskCompleted``) the job completes and its workers are
stopped; a pod that fails or is evicted (a refusing node, a lost node) aborts the whole job
(``AbortJob``) instead of leaving Ray waiting for a node that is gone (ray#54170). Pods never restart
(``restartPolicy: Never``): a failed run is reported, not retried. The ``svc`` plugin also lets only the
job's own pods in (a NetworkPolicy): reach the head's dashboard with ``kubectl port-forward``.

**KubeRay** (``ray.io/v1`` ``RayJob``): KubeRay starts Ray itself (the Ray container is the pod's first,
``containers[0]``, named ``ray-head``/``ray-worker`` as KubeRay's samples name them; its command is left
empty so that KubeRay writes ``ray start``, with the NPUs as ``rayStartParams.resources``), and runs the
``entrypoint`` on the head through ``ray job submit -- ENTRYPOINT``: envrun's driver alone
(``python3 -m envrun.injob driver``). The cluster is shut down when the job ends and the RayJob is removed
ten minutes later. KubeRay replaces a pod that ends (``Failed`` or ``Succeeded``), so its pods keep the
default restart policy: a refusing node stays in ``Init:CrashLoopBackOff`` with its line in
``kubectl logs``, and the RayJob waits for it — give ``active_deadline_seconds`` to bound that. Give
``ray_version`` too: for Ray >= 2.53 KubeRay probes the Ray containers over HTTP, for an unknown version with
``bash -c 'wget …'`` inside the locked image. KubeRay's submitter runs ``ray job submit`` in a pod of the
head's image, after waiting for the dashboard with ``python -c`` (``python``, not ``python3``).
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from envbuild.data.reference import by_digest
from envbuild.errors import InputError
from envrun.cluster.onnet import NOSET
from envrun.injob.spec import HEAD_VAR, INDEX_VAR, IP_VAR, JOB_DIR, NAME_VAR
from envrun.plan import Volume, mount_point

NAME_MAX = 40  # Volcano's pods (and hostnames) <name>-worker-<i>, KubeRay's <name>-<5>-npu-worker-<5>: 63 at most
CONFIGMAP_MAX = 1024 * 1024  # Kubernetes' limit on a ConfigMap's data and binaryData together (bytes)
BUNDLE_DIR = "/opt/envrun/bundle"  # the ConfigMap, mounted
CODE_DIR = JOB_DIR + "/code"
SPEC_PATH = JOB_DIR + "/job.json"
SPEC_KEY = "job.json"
CODE_KEY = "code.zip"
BUNDLE_VOLUME = "envrun-bundle"
JOB_VOLUME = "envrun-job"
SHM_VOLUME = "dshm"
MAIN_CONTAINER = "envrun"  # never "head" nor "worker": Volcano's ray plugin would replace its command
HEAD_TASK = "head"  # the ray plugin's default head task: it makes <name>-head-svc for it
WORKER_TASK = "worker"
WORKER_GROUP = "npu"
RAYJOB_TTL_SECONDS = 600  # how long a finished RayJob (and its submitter's logs) stays
MANAGED_BY = {"app.kubernetes.io/managed-by": "envrun"}

# The first init container: the job into the emptyDir. argv: the ConfigMap's directory, the job's.
UNPACK_SCRIPT = """\
import os, shutil, sys, zipfile
bundle, job = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(os.path.join(bundle, "code.zip")) as code:
    code.extractall(os.path.join(job, "code"))
    count = len(code.namelist())
shutil.copyfile(os.path.join(bundle, "job.json"), os.path.join(job, "job.json"))
print("envrun: unpacked %d file(s) of envrun's code and the job's spec into %s" % (count, job))
"""

_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_EXTENDED_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./:+-]*")  # a PYTHONPATH the RayJob's entrypoint can carry unquoted
_IDENTITY = (INDEX_VAR, NAME_VAR, IP_VAR, HEAD_VAR, "HCCL_IF_IP")


@dataclass(frozen=True)
class KubeJob:
    name: str  # a DNS-1035 label (a RayJob's name must be one): lowercase letters, digits, '-'
    nnodes: int
    npus_per_node: int | None  # None: no NPU resource asked
    image: str  # repository@sha256:<64 hex>
    spec_json: str  # job.json's text
    code_zip: bytes  # envbuild's and envrun's .py files, zipped
    volumes: tuple[Volume, ...] = ()
    file_volumes: frozenset[str] = frozenset()  # the volumes' host paths that are files (else directories)
    env: Mapping[str, str] = field(default_factory=dict)  # the recipe's runtime environment
    namespace: str | None = None
    queue: str = "default"  # Volcano's queue
    npu_resource: str = "huawei.com/Ascend910"
    head_port: int = 6379
    dashboard_port: int = 8265
    client_port: int = 10001
    active_deadline_seconds: int | None = None  # RayJob only: a Volcano Job has no deadline of its own
    ray_version: str | None = None  # the image's Ray (the lock's): the RayJob's rayClusterSpec.rayVersion

    def __post_init__(self) -> None:
        if problem := _problem(self):
            raise InputError(problem)


def _problem(job: KubeJob) -> str | None:
    if len(job.name) > NAME_MAX or not _NAME.fullmatch(job.name):
        return (
            f"Kubernetes job name {job.name!r}: expected at most {NAME_MAX} lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit"
        )
    if job.nnodes < 1:
        return f"Kubernetes job {job.name}: {job.nnodes} node(s); expected at least 1"
    if job.npus_per_node is not None and job.npus_per_node < 1:
        return f"Kubernetes job {job.name}: {job.npus_per_node} NPU(s) per node; expected at least 1, or none asked"
    if not by_digest(job.image):
        return f"Kubernetes job {job.name}: image {job.image!r}: expected repository@sha256:<64 lowercase hex>, by digest only"
    if job.namespace is not None and not _DNS_LABEL.fullmatch(job.namespace):
        return f"Kubernetes job {job.name}: namespace {job.namespace!r} is not a DNS-1123 label"
    if not _DNS_SUBDOMAIN.fullmatch(job.queue):
        return f"Kubernetes job {job.name}: Volcano queue {job.queue!r} is not a DNS-1123 subdomain"
    if not _EXTENDED_RESOURCE.fullmatch(job.npu_resource):
        return f"Kubernetes job {job.name}: NPU resource {job.npu_resource!r}: expected a domain-prefixed name (huawei.com/Ascend910)"
    paths = [mount_point(v.container) for v in job.volumes]  # /runs/ and /runs/. are /runs
    for path in paths:
        if path in (JOB_DIR, BUNDLE_DIR, "/dev/shm") or paths.count(path) > 1:
            return f"Kubernetes job {job.name}: volume at {path}: the path is mounted twice in a pod"
    for port in (job.head_port, job.dashboard_port, job.client_port):
        if not 0 < port < 65536:
            return f"Kubernetes job {job.name}: port {port} is not a TCP port"
    if job.active_deadline_seconds is not None and job.active_deadline_seconds < 1:
        return f"Kubernetes job {job.name}: active deadline {job.active_deadline_seconds} s; expected a positive number"
    for key, value in job.env.items():
        if not _ENV_NAME.fullmatch(key):
            return f"Kubernetes job {job.name}: the job's environment variable {key!r} has a name Kubernetes refuses"
        if key in _IDENTITY:
            return f"Kubernetes job {job.name}: the job's environment sets {key}, which each pod sets for itself"
        if key == NOSET and value != "1":
            return f"Kubernetes job {job.name}: the job's environment sets {key}={value!r}; envrun's nodes need 1"
        if key == "PYTHONPATH" and not _SAFE_PATH.fullmatch(value):
            return f"Kubernetes job {job.name}: the job's PYTHONPATH {value!r} has characters a RayJob's entrypoint cannot carry"
    size = len(job.spec_json.encode()) + len(job.code_zip)  # what counts: the values' bytes (binaryData decoded)
    if size > CONFIGMAP_MAX:
        return (
            f"Kubernetes job {job.name}: its ConfigMap would hold {size} bytes (job.json {len(job.spec_json.encode())}, "
            f"code.zip {len(job.code_zip)}); Kubernetes allows {CONFIGMAP_MAX}"
        )
    return None


def bundle_name(job: KubeJob) -> str:
    return f"{job.name}-envrun"


def head_dns(job: KubeJob) -> str:
    """The Volcano head pod's name in DNS, as the svc plugin makes it: hostname ``<job>-head-0`` (the pod's
    name), subdomain ``<job>`` (its headless Service); found through the namespace's search path."""
    return f"{job.name}-{HEAD_TASK}-0.{job.name}"


def head_service(job: KubeJob) -> str:
    """The RayJob head's Service, as KubeRay names it (``GenerateHeadServiceName``)."""
    return f"{job.name}-head-svc"


def _metadata(job: KubeJob, name: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    metadata["labels"] = {"app.kubernetes.io/name": job.name, **MANAGED_BY}
    return metadata


def render_configmap(job: KubeJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, bundle_name(job)),
        "data": {SPEC_KEY: job.spec_json},
        "binaryData": {CODE_KEY: base64.b64encode(job.code_zip).decode("ascii")},
    }


def _python_path(job: KubeJob) -> str:
    theirs = job.env.get("PYTHONPATH")
    return f"{CODE_DIR}:{theirs}" if theirs else CODE_DIR


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def literal(value: str) -> str:
    """``value`` as a container's env value that Kubernetes leaves as it is: the kubelet expands ``$(NAME)``
    with the container's earlier variables and makes ``$$`` one ``$``, so every ``$`` is doubled (a value
    ``pa$$word`` or ``--home=$(HOME)`` reaches the pod as written, as it reaches every other backend's job)."""
    return value.replace("$", "$$")


def _env(job: KubeJob, index: int | None, head: str | None) -> list[dict[str, Any]]:
    """The job's environment, then who the node is. ``index`` None: the command sets it (Volcano's
    workers, from ``VC_TASK_INDEX``)."""
    env = [{"name": k, "value": literal(v)} for k, v in sorted(job.env.items()) if k not in ("PYTHONPATH", NOSET)]
    env += [
        {"name": "PYTHONPATH", "value": _python_path(job)},
        {"name": NOSET, "value": "1"},
        _field(NAME_VAR, "metadata.name"),
        _field(IP_VAR, "status.podIP"),
        _field("HCCL_IF_IP", "status.podIP"),
    ]
    if index is not None:
        env.append({"name": INDEX_VAR, "value": str(index)})
    if head is not None:
        env.append({"name": HEAD_VAR, "value": head})
    return env


def _resources(job: KubeJob) -> dict[str, Any]:
    if job.npus_per_node is None:
        return {}
    npus = {job.npu_resource: job.npus_per_node}
    return {"resources": {"limits": dict(npus), "requests": dict(npus)}}


def _job_mounts(job: KubeJob) -> list[dict[str, Any]]:
    """What a container that runs the job sees: the job's directory and the run's volumes."""
    mounts: list[dict[str, Any]] = [{"name": JOB_VOLUME, "mountPath": JOB_DIR}]
    for i, volume in enumerate(job.volumes):
        mounts.append({"name": f"volume-{i}", "mountPath": volume.container, "readOnly": volume.mode != "rw"})
    return mounts


def _volumes(job: KubeJob, shm: bool) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": BUNDLE_VOLUME, "configMap": {"name": bundle_name(job)}},
        {"name": JOB_VOLUME, "emptyDir": {}},
    ]
    if shm:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    for i, volume in enumerate(job.volumes):
        # Checked by the kubelet before the pod starts: a path missing on the node fails it, never made empty.
        kind = "File" if volume.host in job.file_volumes else "Directory"
        volumes.append({"name": f"volume-{i}", "hostPath": {"path": volume.host, "type": kind}})
    return volumes


def _unpack(job: KubeJob) -> dict[str, Any]:
    return {
        "name": "envrun-unpack",
        "image": job.image,
        "command": ["python3", "-c", UNPACK_SCRIPT, BUNDLE_DIR, JOB_DIR],
        "volumeMounts": [
            {"name": BUNDLE_VOLUME, "mountPath": BUNDLE_DIR, "readOnly": True},
            {"name": JOB_VOLUME, "mountPath": JOB_DIR},
        ],
    }


def _injob(verb: str) -> list[str]:
    return ["python3", "-m", "envrun.injob", verb, SPEC_PATH]


def _from_task_index(verb: str) -> list[str]:
    """A Volcano worker's command: its node index is its index in the task (the env plugin's
    ``VC_TASK_INDEX``) plus one, the head being node 0."""
    index = "${VC_TASK_INDEX:?unset: the Volcano env plugin sets it}"
    return ["sh", "-c", f"export {INDEX_VAR}=$(({index} + 1)); exec {' '.join(_injob(verb))}"]


def _container(
    job: KubeJob, name: str, command: list[str] | None, env: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    """A container of the image that runs the job (``command`` None: the image's, or KubeRay's)."""
    container: dict[str, Any] = {"name": name, "image": job.image}
    if command is not None:
        container["command"] = command
    return {**container, "env": env, **_resources(job), "volumeMounts": mounts}


def _check(job: KubeJob, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    return _container(job, "envrun-check", command, env, _job_mounts(job))


def _head_ports(job: KubeJob, names: tuple[str, str, str]) -> list[dict[str, Any]]:
    ports = (job.head_port, job.dashboard_port, job.client_port)
    return [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in zip(names, ports)]


# --- Volcano ---------------------------------------------------------------------------------------------

VOLCANO_PORT_NAMES = ("gcs", "dashboard", "client-server")  # the ray plugin's Service targets these names


def _volcano_task(job: KubeJob, head: bool) -> dict[str, Any]:
    if head:
        env, check, node = _env(job, 0, None), _injob("check"), _injob("node")
    else:
        env, check, node = _env(job, None, head_dns(job)), _from_task_index("check"), _from_task_index("node")
    main = _container(
        job, MAIN_CONTAINER, node, env, [*_job_mounts(job), {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    )
    if head:
        main["ports"] = _head_ports(job, VOLCANO_PORT_NAMES)
    task: dict[str, Any] = {
        "name": HEAD_TASK if head else WORKER_TASK,
        "replicas": 1 if head else job.nnodes - 1,
    }
    if head:
        # The head's pod ends when the run does: the job completes, its workers are stopped.
        task["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    task["template"] = {
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [_unpack(job), _check(job, check, copy.deepcopy(env))],
            "containers": [main],
            "volumes": _volumes(job, shm=True),
        }
    }
    return task


def render_volcano(job: KubeJob) -> list[dict[str, Any]]:
    """[the ConfigMap, the Volcano Job]."""
    tasks = [_volcano_task(job, head=True)]
    if job.nnodes > 1:
        tasks.append(_volcano_task(job, head=False))
    volcano = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _metadata(job, job.name),
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": job.nnodes,  # gang: every node's pod, or none
            "queue": job.queue,
            # 1, not 0: Volcano's webhook reads 0 as unset and makes it 3. No policy here restarts anything;
            # with 1, resuming the aborted job by hand (`vcctl job resume`) fails it instead of running it
            # again (state/aborted.go counts a retry, state/restarting.go fails at maxRetry).
            "maxRetry": 1,
            # No activeDeadlineSeconds: a Volcano Job has none (its pods' activeDeadlineSeconds would fail
            # one pod, which then aborts the job); the time limit is the queue's or the caller's.
            "plugins": {
                # ray: only the Service <name>-head-svc here (no container is named head/worker); its ports.
                "ray": [
                    f"--port={job.head_port}",
                    f"--dashboardPort={job.dashboard_port}",
                    f"--clientPort={job.client_port}",
                ],
                "svc": [],  # hostname/subdomain: <name>-head-0.<name>
                "env": [],  # VC_TASK_INDEX
            },
            "policies": [
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": tasks,
        },
    }
    return [render_configmap(job), volcano]


# --- KubeRay ---------------------------------------------------------------------------------------------

KUBERAY_PORT_NAMES = ("gcs-server", "dashboard", "client")  # KubeRay's own names for the head's ports


def entrypoint(job: KubeJob) -> str:
    """The RayJob's entrypoint: a shell command, joined into ``ray job submit … -- ENTRYPOINT`` by KubeRay
    and run by the job's supervisor on the head (so: no quoting, no ``$``)."""
    return f"PYTHONPATH={_python_path(job)} {' '.join(_injob('driver'))}"


def _ray_start_params(job: KubeJob, head: bool) -> dict[str, str]:
    params: dict[str, str] = {}
    if head:
        params["dashboard-host"] = "0.0.0.0"
        params["port"] = str(job.head_port)
        params["dashboard-port"] = str(job.dashboard_port)
        params["ray-client-server-port"] = str(job.client_port)
    if job.npus_per_node is not None:
        # A JSON object in single quotes, as KubeRay itself writes it (common/pod.go): it reads it back
        # with the quotes trimmed, and the quotes keep it one word in the `ray start` it writes.
        params["resources"] = "'" + json.dumps({"NPU": job.npus_per_node}, separators=(",", ":")) + "'"
    return params


def _ray_template(job: KubeJob, head: bool) -> dict[str, Any]:
    # KubeRay gives its workers no ordinal: each is node 1 to its own check (the index names it there,
    # and only a worker needs the head's name); the pod's name tells them apart.
    env = _env(job, 0 if head else 1, None if head else head_service(job))
    ray = _container(job, "ray-head" if head else "ray-worker", None, env, _job_mounts(job))
    if head:
        ray["ports"] = _head_ports(job, KUBERAY_PORT_NAMES)
    return {
        "spec": {
            "initContainers": [_unpack(job), _check(job, _injob("check"), copy.deepcopy(env))],
            "containers": [ray],  # the Ray container is KubeRay's containers[0]
            "volumes": _volumes(job, shm=False),  # KubeRay adds /dev/shm itself
        }
    }


def render_rayjob(job: KubeJob) -> list[dict[str, Any]]:
    """[the ConfigMap, the RayJob]."""
    cluster: dict[str, Any] = {}
    if job.ray_version:
        cluster["rayVersion"] = job.ray_version
    cluster["headGroupSpec"] = {
        "rayStartParams": _ray_start_params(job, head=True),
        "template": _ray_template(job, head=True),
    }
    if job.nnodes > 1:
        workers = job.nnodes - 1
        cluster["workerGroupSpecs"] = [
            {
                "groupName": WORKER_GROUP,
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": _ray_start_params(job, head=False),
                "template": _ray_template(job, head=False),
            }
        ]
    spec: dict[str, Any] = {"entrypoint": entrypoint(job)}
    if job.env:
        env_vars = {**job.env, **({"PYTHONPATH": _python_path(job)} if "PYTHONPATH" in job.env else {})}
        spec["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": env_vars}, sort_keys=False)
    spec["shutdownAfterJobFinishes"] = True
    spec["ttlSecondsAfterFinished"] = RAYJOB_TTL_SECONDS
    if job.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    spec["backoffLimit"] = 0  # a failed run is reported, not submitted again
    spec["rayClusterSpec"] = cluster
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _metadata(job, job.name), "spec": spec}
    return [render_configmap(job), rayjob]


# --- YAML ------------------------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """The safe dumper, with multi-line text (the spec, the unpack script, runtimeEnvYAML) as literal
    blocks where YAML allows one (PyYAML falls back to a quoted scalar where it does not), and every
    value written out where it is (no anchors and aliases)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def dump_manifests(documents: list[dict[str, Any]]) -> str:
    """The documents as one YAML stream, keys in the order they were built, after a comment saying what
    it is and how to submit it."""
    names = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in documents)
    header = (
        f"# envrun: {names}. Submit with `kubectl apply --server-side -f FILE` or `kubectl create -f FILE`\n"
        "# (a plain `kubectl apply -f FILE` copies each object into an annotation of at most 256 KiB: too small\n"
        "# for the ConfigMap that carries envrun's code).\n"
    )
    body = yaml.dump_all(
        documents, Dumper=_Dumper, sort_keys=False, explicit_start=True, allow_unicode=True, width=1 << 16
    )
    return header + body
