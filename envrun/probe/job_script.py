"""The job probe itself: runs where the job will run, with that environment's own verl, and says what the
job would meet there — before anything is launched.

This file is sent whole to the job's interpreter (``python3 -c SOURCE SPEC_JSON``: on this host, in a
container of the image, in a task on every Ray node) and imports nothing of envrun: only the standard
library and what the job itself imports (verl, Hydra, OmegaConf). It prints one line, ``MARKER`` and a
JSON report, last on stdout; everything verl prints goes to stderr.

What it does, in the job's own order (``verl.trainer.main_ppo.main``):

1. compose the run's config with Hydra from the entry module's own config directory (its
   ``@hydra.main(config_path=…)``), the run's ``--config-name`` and exactly its overrides;
2. run the entry module's ``validate_config`` (with ``need_reference_policy`` and ``need_critic``, as
   ``main`` calls them), so parallelism is checked against ``nnodes × npus-per-node``. ``main`` first calls
   ``auto_set_device``, which sets ``trainer.device`` to the accelerator it detects; the probe runs
   without devices, so it keeps the configured device, the one the job's nodes detect;
3. resolve the config as a Ray worker does: the config pickled to a fresh interpreter that has imported
   only the entry module (what unpickling the task runner imports) — Hydra's driver-only resolvers
   (``${now:…}``, ``${hydra:…}``) are not registered there, ``${oc.env:…}`` reads the job's environment.
   That interpreter is started first, before the probe's own import of the entry module: the two imports
   of verl's stack (seconds each) overlap where the host has a core to spare;
4. import what the composed config makes the job import: the task runner ``main`` selects
   (``trainer.use_v1``) and the modules its methods import (read from its source), the trainer class
   (``get_trainer_cls``), the training engine verl registers for ``strategy`` on ``trainer.device`` (found
   in verl's source, ``EngineRegistry.register``), and the rollout verl registers for
   ``actor_rollout_ref.rollout.name``. A failure inside a module the recipe names in ``skip_imports`` is
   reported as skipped, with the recipe's reason;
5. read where the Hugging Face exports go from verl's own functions (``get_hf_model_checkpoint_path``,
   ``MegatronCheckpointManager.should_save_hf_model``), taken from its source and run without importing
   Megatron, and whether this config writes any (``trainer.save_freq``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
import types
from typing import Any

MARKER = "ENVRUN-PROBE "
SOURCE = ""  # this script's text, set when it runs (the worker-side child runs it again)
RESOLVE_FLAG = "--resolve-as-worker"
LANGUAGE_MODEL = "language_model"
# ray.init's arguments that only a new Ray takes: connecting to a running cluster (RAY_ADDRESS, as in a Ray job)
# it raises "When connecting to an existing cluster, num_cpus and num_gpus must not be provided." (Ray 2.60).
RAY_INIT_NEW_CLUSTER_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_node_name")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def skipped_by(exc: BaseException, skip: dict[str, str]) -> str | None:
    """The skip_imports entry a failure belongs to: the module that could not be found, or any module
    the failure passed through, is the entry or inside it."""

    def match(name: str | None) -> str | None:
        for entry in skip:
            if name and (name == entry or name.startswith(entry + ".")):
                return entry
        return None

    if isinstance(exc, ImportError) and (found := match(exc.name)):
        return found
    tb = exc.__traceback__
    while tb is not None:
        if found := match(tb.tb_frame.f_globals.get("__name__")):
            return found
        tb = tb.tb_next
    return None


class Probe:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.skip: dict[str, str] = dict(spec.get("skip_imports") or {})
        self.problems: list[dict[str, str]] = []
        self.imports: list[dict[str, str]] = []
        self.facts: dict[str, Any] = {}
        self.worker: subprocess.Popen[bytes] | None = None

    def problem(self, what: str, detail: str, **where: str) -> None:
        self.problems.append({"what": what, "detail": detail, **where})

    def load(self, module: str, why: str) -> types.ModuleType | None:
        """Import ``module`` as the job would; record ok, skipped (with the recipe's reason) or failed."""
        try:
            loaded = importlib.import_module(module)
        except Exception as exc:  # an import can raise anything; each is a finding
            self.record_failure(module, why, exc)
            return None
        self.imports.append({"module": module, "why": why, "status": "ok"})
        return loaded

    def record_failure(self, module: str, why: str, exc: BaseException) -> None:
        entry = skipped_by(exc, self.skip)
        found = {"module": module, "why": why, "status": "fail", "detail": first_line(exc)}
        self.imports.append(found if entry is None else {**found, "status": "skip", "skip": entry})
        if entry is None:
            self.problem("import", f"{why}: {first_line(exc)}", module=module)

    # -- 1. compose ------------------------------------------------------------------------------------
    def compose(self, entry: types.ModuleType) -> Any:
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        config_dir = os.path.join(os.path.dirname(entry.__file__ or ""), hydra_config_path(entry))
        self.facts["config_dir"] = config_dir
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name=self.spec["config_name"], overrides=list(self.spec["overrides"]))

    # -- 2. validate -----------------------------------------------------------------------------------
    def validate(self, entry: types.ModuleType, config: Any) -> None:
        trainer = config.trainer
        devices = f"{trainer.nnodes} node(s) x {trainer.n_gpus_per_node} NPU(s)"
        try:
            entry.validate_config(
                config=config,
                use_reference_policy=entry.need_reference_policy(config),
                use_critic=entry.need_critic(config),
            )
        except Exception as exc:
            self.problem("validate_config", f"verl's validate_config refuses the run for {devices}: {first_line(exc)}")

    # -- 3. resolve as a worker ------------------------------------------------------------------------
    def start_worker(self) -> None:
        """Start the worker-side interpreter now: it imports the entry module while this one does, then
        waits for the config on its stdin. Its stderr (verl's import chatter) goes to a file, so a full
        pipe can never stall it while this process is busy."""
        self.worker_err = tempfile.TemporaryFile()
        self.worker = subprocess.Popen(
            [sys.executable, "-c", SOURCE, RESOLVE_FLAG, self.spec["entry_module"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.worker_err,
        )

    def stop_worker(self) -> None:
        """The worker is not needed (the probe ended before step 3): gone, and its file closed."""
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.communicate()
        self.worker_err.close()

    def resolve_as_worker(self, config: Any, keys: list[str]) -> dict[str, Any]:
        request = pickle.dumps({"config": config, "keys": keys})
        worker, self.worker = self.worker, None
        assert worker is not None  # started by run()
        try:
            stdout, _ = worker.communicate(request, timeout=600)
        except subprocess.TimeoutExpired:
            worker.kill()
            stdout, _ = worker.communicate()
        self.worker_err.seek(0)
        stderr = self.worker_err.read()
        lines = [line for line in stdout.decode(errors="replace").splitlines() if line.startswith(MARKER)]
        if not lines:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            self.problem("resolve", f"the worker-side resolution exited {worker.returncode}: {' | '.join(tail)}")
            return {}
        answer: dict[str, Any] = json.loads(lines[-1][len(MARKER) :])
        if answer.get("error"):
            self.problem(
                "resolve",
                "the config does not resolve in a Ray worker (Hydra's driver-only resolvers such as ${now:} "
                f"are not registered there): {answer['error']}",
                key=answer.get("key") or "",
            )
        return dict(answer.get("values") or {})

    # -- 4. imports ------------------------------------------------------------------------------------
    def imports_of_the_job(self, entry: types.ModuleType, config: Any) -> None:
        runner_module: types.ModuleType | None
        if config.trainer.get("use_v1", False):
            runner_module, runner = entry, "TaskRunnerV1"
            why = "trainer.use_v1=true: main() runs TaskRunnerV1"
        else:
            runner_module = self.load("verl.trainer.main_ppo_v0", "trainer.use_v1=false: main() runs its TaskRunner")
            runner, why = "TaskRunner", "trainer.use_v1=false: main() runs TaskRunner"
        if runner_module is None:
            return
        for module in class_imports(runner_module, runner):
            self.load(module, f"{why}, which imports it")
        if config.trainer.get("use_v1", False):
            v1 = sys.modules.get("verl.trainer.ppo.v1")
            mode = config.trainer.v1.trainer_mode
            if v1 is not None:
                try:
                    trainer_cls = v1.get_trainer_cls(mode)
                    self.facts["trainer_class"] = f"{trainer_cls.__module__}.{trainer_cls.__qualname__}"
                except Exception as exc:
                    self.problem("trainer", f"trainer.v1.trainer_mode={mode}: {first_line(exc)}")
        self.engine(config)
        self.rollout(config)

    def engine(self, config: Any) -> None:
        actor = config.actor_rollout_ref.actor
        strategy, device = actor.strategy, config.trainer.get("device") or "cuda"
        self.facts.update(strategy=strategy, device=device)
        why = f"actor_rollout_ref.actor.strategy={strategy} on trainer.device={device}: the training engine"
        modules = registered_engines(strategy, device)
        if not modules:
            self.problem("import", f"{why}: verl registers no {LANGUAGE_MODEL} engine for it", key="strategy")
        for module in modules:
            self.load(module, why)

    def rollout(self, config: Any) -> None:
        name = config.actor_rollout_ref.rollout.name
        why = f"actor_rollout_ref.rollout.name={name}: the rollout replica verl registers for it"
        replica = self.load("verl.workers.rollout.replica", why)
        if replica is None:
            return
        loader = replica.RolloutReplicaRegistry._registry.get(name)
        if loader is None:
            known = ", ".join(sorted(replica.RolloutReplicaRegistry._registry))
            self.problem("import", f"{why}: verl registers no rollout {name} (known: {known})", key="rollout.name")
            return
        target = f"{loader.__module__}.{loader.__name__}()"
        try:
            loaded = loader()
        except Exception as exc:
            self.record_failure(target, why, exc)
            return
        self.imports.append({"module": loaded.__module__, "why": why, "status": "ok"})

    # -- 5. exports ------------------------------------------------------------------------------------
    def exports(self, config: Any, resolved: dict[str, Any]) -> dict[str, Any] | None:
        actor = config.actor_rollout_ref.actor
        if actor.strategy != "megatron":
            self.facts["exports"] = f"strategy {actor.strategy}: no Megatron-Bridge HF export to guard"
            return None
        save_freq = int(config.trainer.save_freq)
        try:
            relative = hf_export_path()
            saves_hf = should_save_hf_model(
                list(actor.checkpoint.save_contents), bool(actor.megatron.get("use_dist_checkpointing", False))
            )
        except Exception as exc:
            self.problem("exports", f"cannot read verl's export layout from its source: {first_line(exc)}")
            return None
        root = resolved.get("trainer.default_local_dir")
        contents = list(actor.checkpoint.save_contents)
        if save_freq <= 0:
            expected, why = False, f"trainer.save_freq={save_freq}: no periodic checkpoint, so no HF export"
        elif not saves_hf:
            expected, why = False, f"checkpoint.save_contents={contents} saves no HF weights"
        else:
            expected, why = True, f"trainer.save_freq={save_freq} and save_contents={contents}: HF weights are saved"
        return {
            "root": root,
            "pattern": f"global_step_*/actor/{relative}",
            "expected": expected,
            "why": why,
            "strict": bool(actor.checkpoint.get("strict", True)),
        }

    def run(self) -> dict[str, Any]:
        self.start_worker()
        try:
            return self.run_with_worker()
        finally:
            self.stop_worker()

    def run_with_worker(self) -> dict[str, Any]:
        entry = self.load(self.spec["entry_module"], "the entry point")
        if entry is None:
            return self.report()
        import verl

        self.facts["verl"] = {"version": getattr(verl, "__version__", None), "path": os.path.dirname(verl.__file__)}
        try:
            config = self.compose(entry)
        except Exception as exc:
            self.problem("compose", f"Hydra cannot compose {self.spec['config_name']}: {first_line(exc)}")
            return self.report()
        trainer = config.trainer
        self.facts.update(
            use_v1=bool(trainer.get("use_v1", False)), nnodes=trainer.nnodes, npus_per_node=trainer.n_gpus_per_node
        )
        self.validate(entry, config)
        resolved = self.resolve_as_worker(config, ["trainer.default_local_dir", "trainer.rollout_data_dir"])
        self.imports_of_the_job(entry, config)
        self.ray_cpus(entry, config)
        layout = self.exports(config, resolved)
        return self.report(layout)

    # -- 5. the CPUs the job's Ray actors ask for -------------------------------------------------------
    def ray_cpus(self, entry: types.ModuleType, config: Any) -> None:
        """What the job's first Ray actors ask of Ray's CPU resource, read from their own ``ray.remote``
        options, and what a Ray the job starts itself would have (``ray_init.num_cpus``, else what Ray
        detects here). Facts only: whether Ray is started by the job depends on the backend."""
        parts: list[list[Any]] = []
        runner = "TaskRunnerV1" if config.trainer.get("use_v1", False) else "TaskRunner"
        runner_cls = getattr(entry, runner, None)
        parts.append([f"{runner} (to be placed)", _actor_cpus(runner_cls, 1.0)])
        if runner == "TaskRunnerV1":
            try:
                from transfer_queue.controller import TransferQueueController

                parts.append(["TransferQueueController", _actor_cpus(TransferQueueController, 1.0)])
                backend = config.transfer_queue.backend
                if backend.storage_backend == "SimpleStorage":
                    from transfer_queue.storage.simple_storage import SimpleStorageUnit

                    units = int(backend.SimpleStorage.num_data_storage_units)
                    each = _actor_cpus(SimpleStorageUnit, 1.0)
                    parts.append(
                        [
                            f"{units} SimpleStorageUnit x {each:g} "
                            "(transfer_queue.backend.SimpleStorage.num_data_storage_units)",
                            units * each,
                        ]
                    )
            except Exception as exc:  # the import itself is checked (and reported) with the job's imports
                self.facts["ray_cpus_problem"] = first_line(exc)
        # The runner holds no CPU once placed (Ray's default for an actor): the others are then alive together.
        needed = max(parts[0][1], sum(cpus for _, cpus in parts[1:]))
        ray_init = config.get("ray_kwargs", {}).get("ray_init", {}) or {}
        try:
            import ray._private.utils as ray_utils

            detected = float(ray_utils.get_num_cpus())
        except Exception:
            detected = float(os.cpu_count() or 1)
        num_cpus = ray_init.get("num_cpus")
        if num_cpus is not None:
            num_cpus = self.number("ray_kwargs.ray_init.num_cpus", num_cpus, "ray.init takes a number of CPUs")
        self.facts["ray_cpus"] = {
            "needed": needed,
            "parts": parts,
            "num_cpus": num_cpus,
            "detected": detected,
            # What ray.init refuses when it connects to a running cluster (a job on the Ray backend).
            "set_for_a_new_ray": sorted(k for k in RAY_INIT_NEW_CLUSTER_ONLY if ray_init.get(k) is not None),
        }

    def number(self, key: str, value: Any, why: str) -> float | None:
        """``value`` of config ``key`` as a number; None, and a problem naming the key, when it is none (the
        job would fail on it: the probe says where instead of crashing, and its other findings stand)."""
        try:
            if isinstance(value, bool) or not math.isfinite(float(value)):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            self.problem("config", f"{why}, not {value!r}", key=key)
            return None

    def report(self, exports: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "problems": self.problems,
            "imports": self.imports,
            "facts": self.facts,
            "exports": exports,
        }


def _actor_cpus(cls: Any, default: float) -> float:
    """The ``num_cpus`` of a ``ray.remote`` class's own options (Ray's default when it sets none)."""
    options = getattr(cls, "_default_options", None) or {}
    value = options.get("num_cpus")
    return default if value is None else float(value)


def hydra_config_path(entry: types.ModuleType) -> str:
    """``config_path`` of the entry's ``@hydra.main(...)``, read from its source (verl: ``"config"``)."""
    tree = ast.parse(open(entry.__file__ or "", encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) in ("hydra.main", "main"):
                    for keyword in decorator.keywords:
                        if keyword.arg == "config_path" and isinstance(keyword.value, ast.Constant):
                            return str(keyword.value.value)
    raise LookupError(f"{entry.__file__}: no @hydra.main(config_path=...)")


def class_imports(module: types.ModuleType, name: str) -> list[str]:
    """The modules the methods of class ``name`` import unconditionally (not under an if or a try)."""
    tree = ast.parse(open(module.__file__ or "", encoding="utf-8").read())
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            for method in node.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for statement in method.body:
                        if isinstance(statement, ast.Import):
                            found += [alias.name for alias in statement.names]
                        elif isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
                            found.append(statement.module)
    return list(dict.fromkeys(found))


def _literal_list(node: ast.expr | None, default: list[str]) -> list[str]:
    if node is None:
        return default
    value = ast.literal_eval(node)
    return [value] if isinstance(value, str) else list(value)


def registered_engines(strategy: str, device: str) -> list[str]:
    """Modules of verl.workers.engine whose ``@EngineRegistry.register(...)`` covers (language_model,
    ``strategy``, ``device``), read from verl's source without importing any engine."""
    spec = importlib.util.find_spec("verl.workers.engine")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = list(spec.submodule_search_locations)[0]
    modules = []
    for folder, _dirs, files in sorted(os.walk(root)):
        for file in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            try:
                tree = ast.parse(open(path, encoding="utf-8").read())
            except (OSError, SyntaxError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef):
                    continue
                for decorator in node.decorator_list:
                    if not (
                        isinstance(decorator, ast.Call)
                        and ast.unparse(decorator.func).endswith("EngineRegistry.register")
                    ):
                        continue
                    kwargs = {k.arg: k.value for k in decorator.keywords}
                    try:
                        model_type = _literal_list(kwargs.get("model_type"), [])
                        backends = _literal_list(kwargs.get("backend"), [])
                        devices = _literal_list(kwargs.get("device"), ["cuda"])
                    except ValueError:
                        continue
                    if LANGUAGE_MODEL in model_type and strategy in backends and device in devices:
                        relative = os.path.relpath(path, os.path.dirname(root))[: -len(".py")]
                        modules.append("verl.workers." + relative.replace(os.sep, ".").removesuffix(".__init__"))
    return list(dict.fromkeys(modules))


def _functions_from(module: str, names: list[str], cls: str | None = None) -> dict[str, Any]:
    """Module-level constants and the named functions (of ``cls`` when given) of ``module``'s source,
    executed apart from the module's imports: verl's own code, without importing Megatron."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise LookupError(f"no module {module}")
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            if isinstance(node.value, ast.Constant):
                body.append(node)
        elif cls is None and isinstance(node, ast.FunctionDef) and node.name in names:
            body.append(node)
        elif cls is not None and isinstance(node, ast.ClassDef) and node.name == cls:
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name in names:
                    method.decorator_list = []
                    body.append(method)
    namespace: dict[str, Any] = {"os": os, "local_mkdir_safe": lambda path: None}
    exec(compile(ast.Module(body=body, type_ignores=[]), spec.origin, "exec"), namespace)
    missing = [n for n in names if n not in namespace]
    if missing:
        raise LookupError(f"{module} has no {', '.join(missing)}")
    return namespace


def hf_export_path() -> str:
    """Where a Megatron checkpoint's HF weights go, relative to it (verl 0.9.1: ``model/huggingface``)."""
    functions = _functions_from(
        "verl.utils.megatron_utils", ["get_model_checkpoint_path", "get_hf_model_checkpoint_path"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        return os.path.relpath(functions["get_hf_model_checkpoint_path"](tmp), tmp)


def should_save_hf_model(save_contents: list[str], use_dist_checkpointing: bool) -> bool:
    functions = _functions_from(
        "verl.utils.checkpoint.megatron_checkpoint_manager", ["should_save_hf_model"], cls="MegatronCheckpointManager"
    )
    manager = types.SimpleNamespace(
        checkpoint_save_contents=save_contents, use_dist_checkpointing=use_dist_checkpointing
    )
    return bool(functions["should_save_hf_model"](manager))


def resolve_as_worker(entry_module: str) -> dict[str, Any]:
    """The child: a fresh interpreter with only the entry module imported, as a Ray worker unpickling the
    task runner has; the config resolved as the task runner resolves it."""
    importlib.import_module(entry_module)  # before the config arrives: while the parent imports it too
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    request = pickle.loads(sys.stdin.buffer.read())  # from our own parent, never from elsewhere
    config = request["config"]
    try:
        OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as exc:
        return {"error": first_line(exc), "key": getattr(exc, "full_key", None)}
    return {"values": {key: OmegaConf.select(config, key) for key in request["keys"]}}


def main(argv: list[str]) -> int:
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # verl prints as it goes; only the report goes to stdout
    try:
        report = resolve_as_worker(argv[1]) if argv[:1] == [RESOLVE_FLAG] else Probe(json.loads(argv[0])).run()
    except BaseException as exc:
        report = {"crash": "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]}
    real_stdout.write(MARKER + json.dumps(report, sort_keys=True, default=str) + "\n")
    real_stdout.flush()
    return 0


def own_source() -> str:
    """This script's text, for the worker-side child: from ``python -c SOURCE`` (``sys.orig_argv``) or the file."""
    argv = list(getattr(sys, "orig_argv", []))
    if "-c" in argv[:-1]:
        return argv[argv.index("-c") + 1]
    with open(__file__, encoding="utf-8") as f:
        return f.read()


if __name__ == "__main__":
    SOURCE = own_source()
    sys.exit(main(sys.argv[1:]))
