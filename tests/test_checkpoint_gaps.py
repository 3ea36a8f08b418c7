"""Checkpoint reading paths no other test reached: an interpreter that answers for the model's names
wrongly, hangs or floods (envrun.checkpoint.modelnames), header entries that are malformed in ways the
other tests did not write or that the reference loader accepts (safetensors_header), and a shard that
is not the regular file the directory listing showed by the time it is opened (untrusted.open_regular).

The interpreter is a real process: a small script run by ``--model-python`` as the audit runs the image's
or the job's python, answering what a broken or hostile one could.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from envbuild.errors import InputError
from envrun.checkpoint import ModelNames, ModelNamesError, SafetensorsHeaderError, audit_checkpoint
from envrun.checkpoint import read_safetensors_header as read_header
from envrun.checkpoint.layout import plausible_limit
from envrun.checkpoint.modelnames import MAX_ANSWER_BYTES
from envrun.cli.main import main
from tests.lib.ckptgen import CheckpointSpec, tensor_names, write_checkpoint, write_raw_safetensors

SPEC = CheckpointSpec(include_mtp=False)
MODEL_CLASS = "GlmMoeDsaForCausalLM of transformers 5.10.4 on the meta device (torch 2.13.0)"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    write_checkpoint(tmp_path / "model", SPEC)
    return tmp_path / "model"


def interpreter(tmp_path: Path, body: str) -> tuple[str, str]:
    """A python that answers as ``body`` says, after reading config.json from stdin as the real script
    does: ``answer`` is an honest answer for :data:`SPEC` it may spoil first. Returns the command line for
    ``--model-python`` and the interpreter as errors name it."""
    script = tmp_path / "answer.py"
    honest = {"names": sorted(tensor_names(SPEC)), "class": "GlmMoeDsaForCausalLM"}
    honest |= {"transformers": "5.10.4", "torch": "2.13.0"}
    script.write_text(
        "import hashlib, json, os, sys, time\n"
        "config = sys.stdin.buffer.read()\n"
        f"answer = {honest!r}\n"
        "answer['config_sha256'] = hashlib.sha256(config).hexdigest()\n" + body
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}", f"{sys.executable} {script}"


def audit_error(capsys: pytest.CaptureFixture[str], model: Path, python: str) -> str:
    """The audit with ``--model-python``: exit 1 (the interpreter's fault, not the checkpoint's), nothing on
    stdout, one line on stderr; that line."""
    assert main(["checkpoint", "audit", str(model), "--json", "--model-python", python]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("envrun: error: ").rstrip("\n")


# --- the model's names, from an interpreter -----------------------------------------------------


def test_an_honest_answer_is_taken(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The control for the spoiled answers below: the same script, unspoiled, gives the audit its names.
    python, _ = interpreter(tmp_path, "print(json.dumps(answer))")
    assert main(["checkpoint", "audit", str(model), "--model-python", python]) == 0
    assert f"expected names: {MODEL_CLASS}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        ("answer = []", "the answer holds no list of at most {limit:,} tensor names"),
        ("answer['config_sha256'] = '0' * 64", "the answer is for another config.json than the one sent"),
        ("answer['class'] = 5", "the answer does not say which class and versions made it"),
        ("del answer['torch']", "the answer does not say which class and versions made it"),
    ],
)
def test_a_spoiled_answer_is_refused_naming_the_interpreter(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], spoil: str, message: str
) -> None:
    python, shown = interpreter(tmp_path, f"{spoil}\nprint(json.dumps(answer))")
    limit = plausible_limit(len(tensor_names(SPEC)))  # the most names the audit asks for, for 113 tensors
    assert audit_error(capsys, model, python) == f"{shown}: {message.format(limit=limit)}"


def test_an_answer_over_the_limit_is_refused_unread(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a flood of 256 MiB on stdout leaves in the answer's file, written sparse: one byte past the limit.
    python, shown = interpreter(tmp_path, f"os.lseek(1, {MAX_ANSWER_BYTES}, os.SEEK_SET)\nos.write(1, b'{{')")
    size = MAX_ANSWER_BYTES + 1
    assert audit_error(capsys, model, python) == f"{shown}: an answer of {size:,} bytes, more than 256 MiB"


def test_an_interpreter_that_hangs_is_stopped_at_the_timeout(tmp_path: Path, model: Path) -> None:
    pid_file = tmp_path / "pid"
    _, shown = interpreter(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)")
    names = ModelNames((sys.executable, str(tmp_path / "answer.py")), timeout=2.0)  # far above a python start
    with pytest.raises(ModelNamesError) as info:
        audit_checkpoint(model, expected=names)
    assert str(info.value) == f"{shown}: building the model on the meta device took over 2 s"
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid_file.read_text()), 0)


def test_an_answer_from_elsewhere_over_the_limit_is_refused(model: Path) -> None:
    # A Runner (in production: a container of the image, tests/test_auditnames.py) whose output is too long.
    def flooding(command: list[str], config: bytes, names: ModelNames) -> tuple[int, bytes | str, str]:
        return 0, b" " * (MAX_ANSWER_BYTES + 1), ""

    names = ModelNames(("python3",), where="in image train:1", run=flooding)
    with pytest.raises(ModelNamesError) as info:
        audit_checkpoint(model, expected=names)
    assert (
        str(info.value) == f"python3 in image train:1: an answer of {MAX_ANSWER_BYTES + 1:,} bytes, more than 256 MiB"
    )


@pytest.mark.parametrize("given", [" ", ""])
def test_a_model_python_of_blanks_is_bad_input(model: Path, capsys: pytest.CaptureFixture[str], given: str) -> None:
    # `--model-python "$PY "` or `--model-python "$PY"` with PY unset: a command of no words (the empty one
    # was once taken for no option at all, and the audit went on with its own description).
    assert main(["checkpoint", "audit", str(model), "--model-python", given]) == 2
    assert capsys.readouterr() == ("", f"envrun: error: --model-python {given!r}: names no command\n")


def test_a_model_python_with_an_unbalanced_quote_is_bad_input(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", "audit", str(model), "--model-python", "python3 'x"]) == 2
    assert capsys.readouterr() == ("", 'envrun: error: --model-python "python3 \'x": no closing quotation\n')


# --- header entries -------------------------------------------------------------------------------

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"dtype": "F32", "shape": [2], "offsets": [0, 8]}, "lacks data_offsets"),  # three keys, one misnamed
        ([0, 8], "entry is not an object"),
        ({**F32_2, "shape": "2"}, "shape '2' is not a list of non-negative integers"),
        ({**F32_2, "data_offsets": [0]}, "data_offsets [0] is not [begin, end]"),
        ({**F32_2, "data_offsets": ["0", "8"]}, "data_offsets ['0', '8'] is not [begin, end]"),
        ({**F32_2, "data_offsets": [True, 8]}, "data_offsets [True, 8] is not [begin, end]"),
        ({**F32_2, "data_offsets": [-8, 0]}, "data_offsets [-8, 0] is not [begin, end]"),
        ({**F32_2, "data_offsets": [8, 0]}, "data_offsets [8, 0] end before begin"),
    ],
)
def test_a_malformed_entry_is_named(tmp_path: Path, entry: object, problem: str) -> None:
    path = write_raw_safetensors(tmp_path / "x.safetensors", {"a": entry}, b"\0" * 8)
    with pytest.raises(SafetensorsHeaderError) as info:
        read_header(path)
    assert str(info.value) == f"{path}: malformed header: tensor 'a': {problem}"
    assert info.value.exit_code == 2


def test_every_malformed_entry_is_counted(tmp_path: Path) -> None:
    header = {"a": [0, 8], "b": {**F32_2, "data_offsets": [8, 0]}, "c": F32_2}
    path = write_raw_safetensors(tmp_path / "x.safetensors", header, b"\0" * 8)
    with pytest.raises(SafetensorsHeaderError, match=r"tensor 'a': entry is not an object \(and 1 more\)$"):
        read_header(path)


def test_entries_the_reference_loader_takes_are_taken(tmp_path: Path) -> None:
    # safetensors 0.8 opens both: an empty tensor (no bytes, offsets [n, n]) and an entry with a key it
    # does not know (it ignores it).
    header = {
        "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
        "noted": {**F32_2, "note": "written by a newer writer"},
    }
    path = write_raw_safetensors(tmp_path / "x.safetensors", header, b"\0" * 8)
    tensors = read_header(path).tensors
    assert (tensors["empty"].shape, tensors["empty"].data_offsets) == ((0, 4), (0, 0))
    assert (tensors["noted"].shape, tensors["noted"].data_offsets) == ((2,), (0, 8))


# --- a shard that changed after the directory was listed -----------------------------------------


def test_a_shard_swapped_for_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # The audit checks each file before it opens it; the header reader checks the descriptor it opened
    # too, so a FIFO put in a shard's place in between neither blocks the open nor is read.
    path = tmp_path / "model-00001-of-00002.safetensors"
    os.mkfifo(path)
    with pytest.raises(InputError) as info:
        read_header(path)
    assert str(info.value) == f"{path}: a FIFO, not a regular file" and info.value.exit_code == 2


def test_a_shard_deleted_after_the_listing_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model-00001-of-00002.safetensors"
    with pytest.raises(SafetensorsHeaderError) as info:
        read_header(path)
    assert str(info.value) == f"{path}: cannot open: No such file or directory"


# --- what the refusal of an architecture advises -----------------------------------------------------


def test_a_quantised_checkpoint_is_not_advised_the_model_s_names(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model's own names do not cover a quantised checkpoint's scales, and the audit refuses them for
    # one: the refusal once advised --model-python all the same, and following it got the refusal again.
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    python, _ = interpreter(tmp_path, "print(json.dumps(answer))")
    for extra in ([], ["--model-python", python]):
        assert main(["checkpoint", "audit", str(model), "--json", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "quantization_config ('fp8')" in err, err
        assert "--trust-uniform-layers" in err and "--model-python" not in err, err
    (model / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    assert main(["checkpoint", "audit", str(model), "--json"]) == 2  # the model's names do help here
    assert "give it the model's own names (--model-python PYTHON)" in capsys.readouterr().err


def test_the_help_says_an_interpreter_that_gives_no_names_is_exit_1(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 1 once read, by the help, as "anything else is missing or unexpected" only: a script took a
    # typo in --model-python (or a docker it could not reach) for a broken checkpoint.
    assert main(["checkpoint", "audit", str(model), "--json", "--model-python", str(tmp_path / "no-python")]) == 1
    assert capsys.readouterr().out == ""  # no report: nothing was checked
    assert main(["checkpoint", "audit", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "1 if anything else is missing or unexpected, or if --model-python's python could not give the "
        "model's names (no report then, even with --json: nothing was checked)" in said
    ), said
