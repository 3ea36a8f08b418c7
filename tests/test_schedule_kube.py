"""The Kubernetes rendering (envrun.schedule.kube), as written: the ConfigMap that carries the job, the
Volcano Job and the KubeRay RayJob, every pod's init containers, identity, NPUs and volumes, the refusals,
the unpack script run for real, and the YAML read back. No cluster: the manifests against the CRDs of
Volcano and KubeRay are scripts/accept-k8s-manifests."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from envbuild.errors import InputError
from envrun.injob.spec import HEAD_VAR, INDEX_VAR, IP_VAR, NAME_VAR
from envrun.plan import Volume
from envrun.schedule.kube import (
    CONFIGMAP_MAX,
    KubeJob,
    dump_manifests,
    render_rayjob,
    render_volcano,
)

REPO = Path(__file__).resolve().parents[1]
IMAGE = "registry.example/glm5@sha256:" + "0123456789abcdef" * 4
SPEC = json.dumps({"version": 1, "nnodes": 4, "plan": {"lock_sha256": "ab" * 32}}, indent=2) + "\n"
NPU = "huawei.com/Ascend910"
VOLUMES = (Volume("/data/models", "/models"), Volume("/data/out", "/out", "rw"))


def code_zip(packages: tuple[str, ...] = ("envbuild", "envrun")) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in packages:
            for source in sorted((REPO / package).rglob("*.py")):
                archive.write(source, source.relative_to(REPO).as_posix())
    return buffer.getvalue()


def job(**overrides: Any) -> KubeJob:
    fields: dict[str, Any] = {
        "name": "grpo-glm5",
        "nnodes": 4,
        "npus_per_node": 16,
        "image": IMAGE,
        "spec_json": SPEC,
        "code_zip": b"PK\x05\x06" + b"\0" * 18,  # an empty zip
        "volumes": VOLUMES,
        "env": {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"},
        "active_deadline_seconds": 7200,
        "ray_version": "2.49.1",
    }
    return KubeJob(**{**fields, **overrides})


def volcano(j: KubeJob) -> dict[str, Any]:
    configmap, vcjob = render_volcano(j)
    assert configmap["kind"] == "ConfigMap"
    return vcjob


def rayjob(j: KubeJob) -> dict[str, Any]:
    configmap, ray = render_rayjob(j)
    assert configmap["kind"] == "ConfigMap"
    return ray


def templates(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{role: pod spec} of a Volcano Job (its tasks) or a RayJob (head, worker groups)."""
    if document["kind"] == "Job":
        return {task["name"]: task["template"]["spec"] for task in document["spec"]["tasks"]}
    cluster = document["spec"]["rayClusterSpec"]
    found = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    for group in cluster.get("workerGroupSpecs", []):
        found[group["groupName"]] = group["template"]["spec"]
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def both(j: KubeJob) -> list[dict[str, Any]]:
    return [volcano(j), rayjob(j)]


# --- shared by both kinds ----------------------------------------------------------------------------------


def test_the_configmap_carries_the_spec_and_the_code() -> None:
    zipped = code_zip(("envrun",))
    for render in (render_volcano, render_rayjob):
        configmap = render(job(code_zip=zipped, namespace="rl"))[0]
        assert configmap["apiVersion"] == "v1"
        assert configmap["metadata"]["name"] == "grpo-glm5-envrun"
        assert configmap["metadata"]["namespace"] == "rl"
        assert configmap["data"] == {"job.json": SPEC}
        assert base64.b64decode(configmap["binaryData"]["code.zip"]) == zipped


def test_a_configmap_over_kubernetes_limit_is_refused_naming_its_size() -> None:
    with pytest.raises(InputError) as refused:
        job(code_zip=b"\0" * CONFIGMAP_MAX)
    message = str(refused.value)
    assert "\n" not in message
    assert str(CONFIGMAP_MAX + len(SPEC)) in message and str(CONFIGMAP_MAX) in message
    job(code_zip=b"\0" * (CONFIGMAP_MAX - len(SPEC)))  # exactly the limit is allowed


@pytest.mark.parametrize("name", ["Grpo", "1grpo", "grpo_glm5", "-grpo", "grpo-", "g" * 41, "", "grpo.glm5"])
def test_a_name_that_is_no_dns_label_is_refused(name: str) -> None:
    with pytest.raises(InputError) as refused:
        job(name=name)
    assert "\n" not in str(refused.value) and "name" in str(refused.value)


def test_the_longest_name_is_accepted() -> None:
    assert volcano(job(name="g" * 40))["metadata"]["name"] == "g" * 40


@pytest.mark.parametrize(
    "image",
    [
        "registry.example/glm5:latest",
        "registry.example/glm5@sha256:abc",
        "registry.example/glm5@sha256:" + "A" * 64,
        "registry.example/GLM5@sha256:" + "a" * 64,
        "registry.example/glm5:v1@sha256:" + "a" * 64,
        "registry.example/glm5@sha512:" + "a" * 128,
        "@sha256:" + "a" * 64,
    ],
)
def test_an_image_not_by_digest_is_refused(image: str) -> None:
    with pytest.raises(InputError) as refused:
        job(image=image)
    assert "\n" not in str(refused.value) and "image" in str(refused.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"nnodes": 0},
        {"npus_per_node": 0},
        {"head_port": 0},
        {"active_deadline_seconds": 0},
        {"namespace": "RL"},
        {"queue": "Bad_Queue"},
        {"npu_resource": "Ascend910"},
        {"env": {"1BAD": "x"}},
        {"volumes": (Volume("/a", "/models"), Volume("/b", "/models"))},
        {"volumes": (Volume("/a", "/opt/envrun/job"),)},
    ],
)
def test_what_kubernetes_would_refuse_is_refused_here(overrides: dict[str, Any]) -> None:
    with pytest.raises(InputError) as refused:
        job(**overrides)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "volumes",
    [
        (Volume("/a", "/runs"), Volume("/b", "/runs/")),  # the same mount point: a pod would keep one
        (Volume("/a", "/opt/envrun/job/"),),
        (Volume("/a", "/opt/envrun/bundle/."),),
    ],
)
def test_a_mount_point_taken_twice_is_refused_however_it_is_spelled(volumes: tuple[Volume, ...]) -> None:
    with pytest.raises(InputError, match="is mounted twice in a pod"):
        job(volumes=volumes)


@pytest.mark.parametrize("name", [INDEX_VAR, NAME_VAR, IP_VAR, HEAD_VAR, "HCCL_IF_IP"])
def test_the_job_environment_cannot_set_who_a_node_is(name: str) -> None:
    with pytest.raises(InputError, match=name):
        job(env={name: "x"})


def test_every_container_runs_the_locked_image_by_digest() -> None:
    for document in both(job()):
        for role, pod in templates(document).items():
            containers = pod["initContainers"] + pod["containers"]
            assert [c["image"] for c in containers] == [IMAGE] * len(containers), (document["kind"], role)


def test_every_pod_unpacks_then_checks_itself_before_it_starts() -> None:
    for document in both(job()):
        for role, pod in templates(document).items():
            unpack, check = pod["initContainers"]
            assert unpack["name"] == "envrun-unpack" and check["name"] == "envrun-check", (document["kind"], role)
            assert unpack["command"][:2] == ["python3", "-c"]
            assert unpack["command"][3:] == ["/opt/envrun/bundle", "/opt/envrun/job"]
            assert {m["mountPath"]: m.get("readOnly", False) for m in unpack["volumeMounts"]} == {
                "/opt/envrun/bundle": True,
                "/opt/envrun/job": False,
            }
            assert " ".join(check["command"]).endswith("python3 -m envrun.injob check /opt/envrun/job/job.json")
            assert env_of(check)["PYTHONPATH"] == "/opt/envrun/job/code"
            assert check["resources"]["limits"] == {NPU: 16}  # the check sees the node's NPUs
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert volumes["envrun-bundle"]["configMap"] == {"name": "grpo-glm5-envrun"}
            assert volumes["envrun-job"]["emptyDir"] == {}


def test_every_node_knows_itself_from_the_downward_api() -> None:
    for document in both(job()):
        for role, pod in templates(document).items():
            for container in [pod["initContainers"][1], pod["containers"][0]]:
                env = env_of(container)
                assert env[NAME_VAR] == {"fieldRef": {"fieldPath": "metadata.name"}}, role
                assert env[IP_VAR] == {"fieldRef": {"fieldPath": "status.podIP"}}
                assert env["HCCL_IF_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
                assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
                assert env["VERL_VLLM_ASCEND_GLM52_PATCH"] == "1"  # the job's own environment
                assert len(env) == len(container["env"]), "a name set twice"


def test_the_npus_are_asked_on_the_main_container_and_the_check() -> None:
    for document in both(job(npus_per_node=8, npu_resource="huawei.com/Ascend910B")):
        for pod in templates(document).values():
            for container in [pod["initContainers"][1], pod["containers"][0]]:
                npus = {"huawei.com/Ascend910B": 8}
                assert container["resources"] == {"limits": npus, "requests": npus}
            assert "resources" not in pod["initContainers"][0]
    for document in both(job(npus_per_node=None)):
        for pod in templates(document).values():
            assert all("resources" not in c for c in pod["initContainers"] + pod["containers"])


def test_a_volume_that_is_a_file_is_a_file_host_path() -> None:
    """A `Directory` hostPath of a file fails the kubelet's check, and Volcano's PodFailed aborts the job."""
    volumes = (Volume("/data/train.parquet", "/train.parquet"), Volume("/data/models", "/models"))
    for document in both(job(volumes=volumes, file_volumes=frozenset({"/data/train.parquet"}))):
        for pod in templates(document).values():
            kinds = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v}
            assert kinds == {"/data/train.parquet": "File", "/data/models": "Directory"}


def test_the_run_volumes_are_host_paths_mounted_where_the_job_runs() -> None:
    for document in both(job()):
        for pod in templates(document).values():
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert volumes["volume-0"]["hostPath"] == {"path": "/data/models", "type": "Directory"}
            assert volumes["volume-1"]["hostPath"] == {"path": "/data/out", "type": "Directory"}
            for container in [pod["initContainers"][1], pod["containers"][0]]:
                mounts = {m["name"]: m for m in container["volumeMounts"]}
                assert mounts["volume-0"] == {"name": "volume-0", "mountPath": "/models", "readOnly": True}
                assert mounts["volume-1"] == {"name": "volume-1", "mountPath": "/out", "readOnly": False}
                assert mounts["envrun-job"]["mountPath"] == "/opt/envrun/job"
            unpack_mounts = {m["name"] for m in pod["initContainers"][0]["volumeMounts"]}
            assert unpack_mounts == {"envrun-bundle", "envrun-job"}
            mounted = {m["name"] for c in pod["initContainers"] + pod["containers"] for m in c["volumeMounts"]}
            assert mounted == set(volumes), "a volume mounted nowhere, or a mount of no volume"


def test_a_python_path_of_the_job_follows_envrun_code() -> None:
    j = job(env={"PYTHONPATH": "/opt/verl"})
    head = templates(volcano(j))["head"]["containers"][0]
    assert env_of(head)["PYTHONPATH"] == "/opt/envrun/job/code:/opt/verl"
    assert rayjob(j)["spec"]["entrypoint"].startswith("PYTHONPATH=/opt/envrun/job/code:/opt/verl python3 ")
    with pytest.raises(InputError, match="PYTHONPATH"):
        job(env={"PYTHONPATH": "$HOME/lib"})


def kubelet_expand(value: str, defined: dict[str, str]) -> str:
    """What the kubelet makes of a container's env value (Kubernetes' ``third_party/forked/golang/expansion``,
    as the EnvVar API documents it): ``$$`` is one ``$``; ``$(NAME)`` is NAME's value when an earlier variable
    of the container defines it, else left as written."""
    out, i = [], 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
        elif value[i + 1] == "$":
            out.append("$")
            i += 2
        elif value[i + 1] == "(" and (end := value.find(")", i + 2)) != -1:
            name = value[i + 2 : end]
            out.append(defined.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append(value[i : i + 2])
            i += 2
    return "".join(out)


def test_the_job_environment_reaches_every_container_as_written() -> None:
    asked = {"A_TOKEN": "pa$$word", "B_OPTS": '--home=$(A_TOKEN) "q" $HOME', "C_TAIL": "cost$", "D_SPLIT": "$(x"}
    for document in both(job(env=asked)):
        for pod in templates(document).values():
            for container in pod["initContainers"][1:] + pod["containers"]:
                seen: dict[str, str] = {}
                for variable in container["env"]:
                    if "value" in variable:
                        seen[variable["name"]] = kubelet_expand(variable["value"], seen)
                assert {name: seen[name] for name in asked} == asked, container["name"]


# --- Volcano -----------------------------------------------------------------------------------------------


def test_volcano_gang_schedules_every_node_and_ends_with_the_head() -> None:
    document = volcano(job(queue="rl-queue", namespace="rl"))
    assert document["apiVersion"] == "batch.volcano.sh/v1alpha1" and document["kind"] == "Job"
    assert document["metadata"]["namespace"] == "rl"
    spec = document["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["minAvailable"] == 4
    assert spec["queue"] == "rl-queue"
    assert spec["maxRetry"] == 1  # 0 would be made 3 by Volcano's webhook
    assert set(spec["plugins"]) == {"ray", "svc", "env"}
    assert spec["plugins"]["svc"] == [] and spec["plugins"]["env"] == []
    assert spec["plugins"]["ray"] == ["--port=6379", "--dashboardPort=8265", "--clientPort=10001"]
    assert spec["policies"] == [
        {"event": "PodEvicted", "action": "AbortJob"},
        {"event": "PodFailed", "action": "AbortJob"},
    ]
    head, worker = spec["tasks"]
    assert (head["name"], head["replicas"]) == ("head", 1)
    assert (worker["name"], worker["replicas"]) == ("worker", 3)
    assert head["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert "policies" not in worker
    for task in spec["tasks"]:
        assert task["template"]["spec"]["restartPolicy"] == "Never"


def test_volcano_main_container_is_named_so_that_the_ray_plugin_keeps_its_command() -> None:
    for pod in templates(volcano(job())).values():
        names = [c["name"] for c in pod["initContainers"] + pod["containers"]]
        assert [c["name"] for c in pod["containers"]] == ["envrun"]
        assert "head" not in names and "worker" not in names


def test_volcano_head_runs_the_node_as_node_zero_and_declares_the_plugin_ports() -> None:
    head = templates(volcano(job(dashboard_port=8300)))["head"]
    main = head["containers"][0]
    assert main["command"] == ["python3", "-m", "envrun.injob", "node", "/opt/envrun/job/job.json"]
    assert head["initContainers"][1]["command"] == [
        "python3",
        "-m",
        "envrun.injob",
        "check",
        "/opt/envrun/job/job.json",
    ]
    assert env_of(main)[INDEX_VAR] == "0" and HEAD_VAR not in env_of(main)
    # The ray plugin's Service targets these port names.
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {
        "gcs": 6379,
        "dashboard": 8300,
        "client-server": 10001,
    }
    assert {m["mountPath"] for m in main["volumeMounts"]} >= {"/dev/shm"}


def test_volcano_workers_take_their_index_from_the_env_plugin_and_find_the_head_by_the_svc_plugin_name() -> None:
    worker = templates(volcano(job()))["worker"]
    for container, verb in ((worker["initContainers"][1], "check"), (worker["containers"][0], "node")):
        assert container["command"][:2] == ["sh", "-c"]
        assert "VC_TASK_INDEX" in container["command"][2]
        assert container["command"][2].endswith(f"exec python3 -m envrun.injob {verb} /opt/envrun/job/job.json")
        env = env_of(container)
        assert INDEX_VAR not in env
        assert env[HEAD_VAR] == "grpo-glm5-head-0.grpo-glm5"
    assert "ports" not in worker["containers"][0]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_volcano_worker_index_is_the_task_index_plus_one(shell: str) -> None:
    command = templates(volcano(job()))["worker"]["containers"][0]["command"][2]
    probe = command.replace("exec python3 -m envrun.injob node /opt/envrun/job/job.json", f"exec printenv {INDEX_VAR}")
    assert probe != command
    ran = subprocess.run(
        [shell, "-c", probe], env={"PATH": os.environ["PATH"], "VC_TASK_INDEX": "6"}, capture_output=True, text=True
    )
    assert (ran.returncode, ran.stdout) == (0, "7\n")
    unset = subprocess.run([shell, "-c", probe], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert unset.returncode != 0 and "VC_TASK_INDEX" in unset.stderr and unset.stdout == ""


def test_volcano_single_node_has_the_head_task_only() -> None:
    spec = volcano(job(nnodes=1))["spec"]
    assert spec["minAvailable"] == 1
    assert [t["name"] for t in spec["tasks"]] == ["head"]


# --- KubeRay -----------------------------------------------------------------------------------------------


def test_rayjob_runs_the_driver_and_ends_with_it() -> None:
    document = rayjob(job())
    assert document["apiVersion"] == "ray.io/v1" and document["kind"] == "RayJob"
    spec = document["spec"]
    assert (
        spec["entrypoint"] == "PYTHONPATH=/opt/envrun/job/code python3 -m envrun.injob driver /opt/envrun/job/job.json"
    )
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}}
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["backoffLimit"] == 0
    assert spec["rayClusterSpec"]["rayVersion"] == "2.49.1"
    bare = rayjob(job(active_deadline_seconds=None, ray_version=None, env={}))["spec"]
    assert "activeDeadlineSeconds" not in bare and "rayVersion" not in bare["rayClusterSpec"]
    assert "runtimeEnvYAML" not in bare


def test_rayjob_groups_ask_ray_for_the_npus() -> None:
    cluster = rayjob(job())["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head["dashboard-host"] == "0.0.0.0"
    assert (head["port"], head["dashboard-port"], head["ray-client-server-port"]) == ("6379", "8265", "10001")
    (group,) = cluster["workerGroupSpecs"]
    assert group["groupName"] == "npu"
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 3
    for params in (head, group["rayStartParams"]):
        quoted = params["resources"]
        assert quoted[0] == quoted[-1] == "'"  # as KubeRay writes it: one shell word
        assert json.loads(quoted[1:-1]) == {"NPU": 16}
    assert all(isinstance(v, str) for v in {**head, **group["rayStartParams"]}.values())
    assert (
        "resources" not in rayjob(job(npus_per_node=None))["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    )


def test_rayjob_ray_container_is_the_first_and_keeps_kuberay_command() -> None:
    pods = templates(rayjob(job()))
    head, worker = pods["head"]["containers"], pods["npu"]["containers"]
    assert [c["name"] for c in head] == ["ray-head"] and [c["name"] for c in worker] == ["ray-worker"]
    for container in head + worker:
        assert "command" not in container and "args" not in container  # KubeRay writes `ray start`
    assert {p["name"]: p["containerPort"] for p in head[0]["ports"]} == {
        "gcs-server": 6379,
        "dashboard": 8265,
        "client": 10001,
    }
    assert env_of(head[0])[INDEX_VAR] == "0"
    assert env_of(worker[0])[INDEX_VAR] == "1"
    assert env_of(worker[0])[HEAD_VAR] == "grpo-glm5-head-svc"
    # The driver runs on the head: its Ray container sees the job's directory.
    assert "/opt/envrun/job" in {m["mountPath"] for m in head[0]["volumeMounts"]}
    for pod in pods.values():
        assert "restartPolicy" not in pod  # KubeRay replaces ended pods: see the module's docstring


def test_rayjob_single_node_has_no_worker_group() -> None:
    cluster = rayjob(job(nnodes=1))["spec"]["rayClusterSpec"]
    assert "workerGroupSpecs" not in cluster
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["name"] == "ray-head"


# --- the unpack script, run; the YAML, read back -------------------------------------------------------------


@pytest.mark.parametrize("render", [render_volcano, render_rayjob])
def test_the_unpack_script_unpacks_a_real_bundle(tmp_path: Path, render: Any) -> None:
    zipped = code_zip()
    configmap, document = render(job(code_zip=zipped))
    bundle, target = tmp_path / "bundle", tmp_path / "job"
    bundle.mkdir()
    target.mkdir()
    # The ConfigMap as the kubelet mounts it: one file per key.
    (bundle / "job.json").write_text(configmap["data"]["job.json"], encoding="utf-8")
    (bundle / "code.zip").write_bytes(base64.b64decode(configmap["binaryData"]["code.zip"]))
    command = next(iter(templates(document).values()))["initContainers"][0]["command"]
    ran = subprocess.run(
        [sys.executable, *command[1:-2], str(bundle), str(target)], cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert "envrun: unpacked" in ran.stdout
    assert (target / "job.json").read_text(encoding="utf-8") == SPEC
    names = zipfile.ZipFile(io.BytesIO(zipped)).namelist()
    assert all((target / "code" / name).is_file() for name in names)
    imported = subprocess.run(
        [sys.executable, "-c", "import envrun.injob.node as m; print(m.__file__)"],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(target / "code")},
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == str(target / "code" / "envrun" / "injob" / "node.py")


@pytest.mark.parametrize("render", [render_volcano, render_rayjob])
@pytest.mark.parametrize("nnodes", [1, 32])
def test_the_manifests_read_back_as_built(render: Any, nnodes: int) -> None:
    documents = render(job(nnodes=nnodes, code_zip=code_zip(("envrun",))))
    text = dump_manifests(documents)
    assert text.startswith("# envrun: ") and "kubectl" in text.splitlines()[0]
    assert list(yaml.safe_load_all(text)) == documents
    assert "&id" not in text and "*id" not in text  # no anchors: each value where it is
    assert text.index("apiVersion: v1") < text.index("kind: ConfigMap")  # keys in the order built
    assert dump_manifests(render(job(nnodes=nnodes, code_zip=code_zip(("envrun",))))) == text
