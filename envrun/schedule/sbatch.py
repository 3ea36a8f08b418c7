"""The Slurm batch job, as two bash scripts (pure rendering): ``job.sbatch`` and the ``node.sh`` it runs on
every node of the allocation.

- ``job.sbatch`` asks for N nodes, one task each; finds each node's address (its ``NodeAddr``, resolved)
  and machine (``NodeHostName``); runs ``node.sh`` as two steps, the head's and the workers'
  (``--kill-on-bad-exit``: one worker lost ends the workers' step), and waits for the first to end
  (``wait -n``). When the head's ends, the run has ended: the workers are stopped and the job exits with the
  head's status — the run's. When the workers' step ends first, a node was lost or refused: the head is
  stopped too (a Ray job waiting for a dead node would wait forever, ray#54170), and the job fails, saying
  so in ``ended.txt``.
- ``node.sh`` pulls the image by digest and runs this node's container of it (host networking, the node's
  Ascend devices and driver files where the host has them, the run's volumes, the job's directory at
  ``/opt/envrun/job``), with ``python3 -m envrun.injob node`` as its process (:mod:`envrun.injob.node`).
  Slurm signals the step, not the container (the container is the engine's child, not the step's): a
  TERM trap removes the container, and so does the script's exit. The container runs in the background so
  the trap runs at once (bash runs a trap only once a foreground command ends).

Every node needs bash, the docker CLI and its engine, and sees the run's directory at the same path (the
job's directory is there); the submitting host needs Slurm's commands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from shlex import quote as _q

from envrun.bytecode import DONT_WRITE_ENV, MOUNT, PREFIX_ENV, VOLUME_PREFIX
from envrun.dockerhost import DEVICE_PATTERNS, DRIVER_MOUNTS
from envrun.injob.spec import HEAD_VAR, INDEX_VAR, IP_VAR, JOB_DIR, MACHINES_VAR, NAME_VAR
from envrun.plan import Volume

JOB_LABEL = "io.envrun.slurm.job"  # every container of a batch job carries its job id
NODE_LABEL = "io.envrun.slurm.node"
STOP_SECONDS = 20  # docker's grace for a container asked to stop, inside Slurm's KillWait (30 s by default)


@dataclass(frozen=True)
class SlurmJob:
    name: str  # the job's name in squeue
    nnodes: int
    job_dir: str  # absolute, the same on every node: the spec, envrun's code, the record, the output
    image: str  # repository@sha256:…
    volumes: tuple[Volume, ...] = ()
    sbatch_args: tuple[str, ...] = ()  # --partition=…, --time=…, --account=…
    env: Mapping[str, str] | None = None  # the containers' environment beyond the node's (bytecode choice)


# What sbatch's directive parser takes unquoted as one word: it splits a #SBATCH line on whitespace, ends it
# at an unquoted '#' and drops quotes and backslashes (Slurm 22.05's `sbatch --test-only -v` shows the values).
_DIRECTIVE_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def sbatch_directive(option: str) -> str:
    """One ``#SBATCH`` line giving sbatch ``option`` as one word: in double quotes where it needs them, a
    backslash before each backslash and double quote (sbatch's parser unescapes them inside quotes too)."""
    if _DIRECTIVE_PLAIN.fullmatch(option):
        return f"#SBATCH {option}"
    return '#SBATCH "' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_pattern(job_dir: str) -> str:
    """Slurm's output file in ``job_dir``: its '%' doubled, as Slurm's filename patterns take a literal '%'
    (a backslash would turn the pattern's %j off: :func:`job_dir_problem` refuses it)."""
    return job_dir.replace("%", "%%") + "/slurm-%j.out"


def job_dir_problem(job_dir: str) -> str | None:
    """Why ``job_dir`` cannot be the job's directory (None when it can): the scripts name it, and Slurm and
    docker read it back. A line break would end the header's comment or a #SBATCH line and start a command;
    a backslash turns Slurm's output pattern off (no ``slurm-<id>.out``, literally ``slurm-%j.out``); docker
    splits ``-v JOB_DIR:/opt/envrun/job`` on ':'."""
    if not job_dir.isprintable():
        return "contains a control character, which would break the job's scripts (a line break starts a command)"
    if "\\" in job_dir:
        return "contains a backslash, which turns Slurm's %j off in the job's output file name"
    if ":" in job_dir:
        return "contains ':', which a docker bind cannot hold (every node mounts the job's directory)"
    return None


def sbatch_header(job: SlurmJob) -> list[str]:
    options = [
        f"--job-name={job.name}",
        f"--nodes={job.nnodes}",
        "--ntasks-per-node=1",
        f"--output={output_pattern(job.job_dir)}",
        *job.sbatch_args,
    ]
    return [sbatch_directive(option) for option in options]


NODE_FACTS = """\
# A node's address on the cluster's network (Slurm's NodeAddr, resolved) and its machine (NodeHostName).
node_field() { scontrol show node -o "$1" | tr ' ' '\\n' | sed -n "s/^$2=//p"; }
resolve() { getent ahostsv4 "$1" | awk 'NR == 1 { print $1 }'; }
"""


def render_batch(job: SlurmJob) -> str:
    return f"""#!/bin/bash
# envrun: a run as a Slurm batch job; submit it with `sbatch {_q(job.job_dir + "/job.sbatch")}`.
{chr(10).join(sbatch_header(job))}
set -uo pipefail
job_dir={_q(job.job_dir)}
{NODE_FACTS}
read -r -a nodes <<<"$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\\n' ' ')"
machines=""
for node in "${{nodes[@]}}"; do machines+="$(node_field "$node" NodeHostName) "; done
export ENVRUN_NODES="${{nodes[*]}}" {MACHINES_VAR}="$machines"
export {HEAD_VAR}="$(resolve "$(node_field "${{nodes[0]}}" NodeAddr)")"
echo "envrun: Slurm job $SLURM_JOB_ID on ${{#nodes[@]}} node(s): ${{nodes[*]}}; the head is ${{nodes[0]}} at ${HEAD_VAR}" >&2

ended() {{ echo "$1" >"$job_dir/ended.txt"; echo "envrun: $1" >&2; }}
steps=()
# TERM to every step's tasks (not the batch shell): each node's script removes its container and ends, and
# so do the steps. Not `kill` of srun: srun ends its step at once with SIGKILL, before any trap runs.
stop_steps() {{ scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null; wait; }}
trap 'ended "the batch job was signalled (scancel, or its time limit): every node stopped"; stop_steps; exit 143' TERM INT

srun --nodes=1 --ntasks=1 --relative=0 --overlap --kill-on-bad-exit=1 bash "$job_dir/node.sh" &
head=$!
steps+=("$head")
if ((${{#nodes[@]}} > 1)); then
    workers=$((${{#nodes[@]}} - 1))
    srun --nodes=$workers --ntasks=$workers --ntasks-per-node=1 --relative=1 --overlap --kill-on-bad-exit=1 \\
        bash "$job_dir/node.sh" &
    steps+=("$!")
fi
wait -n -p first "${{steps[@]}}"
status=$?
if [[ $first == "$head" ]]; then
    ended "the head's step ended (exit $status): the run is over"
else
    ended "the workers' step ended (exit $status) before the run: a node was lost or refused the run; the head is stopped"
    ((status != 0)) || status=1
fi
stop_steps
# A container a killed script could not remove (its node's engine was slow to answer): removed here, on every
# node, while the allocation is still the job's.
srun --nodes="${{#nodes[@]}}" --ntasks-per-node=1 --overlap bash -c \
    'docker ps -aq --filter "label={JOB_LABEL}=$SLURM_JOB_ID" | xargs -r docker rm -f >/dev/null' 2>/dev/null
exit "$status"
"""


def render_node(job: SlurmJob) -> str:
    options = [f"-v {_q(f'{v.host}:{v.container}:{v.mode}')}" for v in job.volumes]
    options += [f"-e {_q(f'{k}={v}')}" for k, v in sorted((job.env or {}).items())]
    if not ({PREFIX_ENV, DONT_WRITE_ENV} & set(job.env or {})):
        options.insert(
            0, f'-v "{VOLUME_PREFIX}${{image_id:7:16}}:{MOUNT}" -e {PREFIX_ENV}={MOUNT} -e {DONT_WRITE_ENV}='
        )
    more = "".join(f"    {option} \\\n" for option in options)
    devices = " ".join(DEVICE_PATTERNS)
    drivers = " ".join(_q(p) for p in DRIVER_MOUNTS)
    return f"""#!/bin/bash
# envrun: one node of the Slurm job: this node's container of the locked image (envrun.injob node).
set -uo pipefail
job_dir={_q(job.job_dir)}
image={_q(job.image)}
{NODE_FACTS}
read -r -a nodes <<<"$ENVRUN_NODES"
index=-1
for i in "${{!nodes[@]}}"; do [[ ${{nodes[$i]}} == "$SLURMD_NODENAME" ]] && index=$i; done
if ((index < 0)); then echo "envrun: $SLURMD_NODENAME is not among the job's nodes (${{nodes[*]}})" >&2; exit 2; fi
name="envrun-$SLURM_JOB_ID-$index"
ip=$(resolve "$(node_field "$SLURMD_NODENAME" NodeAddr)")

docker pull -q "$image" >/dev/null || {{ echo "envrun: $SLURMD_NODENAME: cannot pull $image" >&2; exit 1; }}
image_id=$(docker image inspect -f '{{{{.Id}}}}' "$image") || exit 1
args=()
for device in {devices}; do [[ -e $device ]] && args+=(--device "$device:$device:rwm"); done
for path in {drivers}; do [[ -e $path ]] && args+=(-v "$path:$path:ro"); done
shm=$(awk '/^MemTotal:/ {{ print int($2 / 2) "k" }}' /proc/meminfo)

stop() {{ docker rm -f "$name" >/dev/null 2>&1; }}
trap 'stop; exit 143' TERM INT
trap stop EXIT
docker run --rm --init --name "$name" --network host --shm-size "$shm" --stop-timeout {STOP_SECONDS} \\
    --label "{JOB_LABEL}=$SLURM_JOB_ID" --label "{NODE_LABEL}=$index" \\
    -v "$job_dir:{JOB_DIR}" -e PYTHONPATH={JOB_DIR}/code \\
    -e {INDEX_VAR}="$index" -e {NAME_VAR}="$SLURMD_NODENAME" -e {IP_VAR}="$ip" \\
    -e {HEAD_VAR}="${HEAD_VAR}" -e {MACHINES_VAR}="${MACHINES_VAR}" \\
{more}    "${{args[@]}}" \\
    "$image" python3 -m envrun.injob node {JOB_DIR}/job.json &
wait $!
"""
