"""The guides' command blocks run as written: pock-opt, Deploying, Federated fine-tuning, the LLM's
steps by hand and CONTRIBUTING's test commands.

Each test reads its block with tests/docs_blocks.py and runs every command line in a shell, in a
scratch directory that mirrors the repository root (examples/, lit_tests/ and .cache/ linked in),
with the venv's bin directory first on PATH, as for a user who activated the venv.
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from docs_blocks import REPO, doc_commands
from safetensors.numpy import load_file

from pock_mlir.runtime import Trainer

VENV_BIN = Path(sys.executable).parent


def user_directory(tmp_path: Path) -> Path:
    for name in ("examples", "lit_tests", ".cache"):
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_pock_opt_block(tmp_path):
    """The block writes its own step.mlir (the digits MLP's training stage), then runs pock-opt on it."""
    writes_the_module, *commands = doc_commands("docs/pock-opt.md", "## pock-opt")
    assert len(commands) >= 6 and all(c.split()[0] in ("pock-opt", "iree-opt") for c in commands)
    cwd = user_directory(tmp_path)
    done = run(writes_the_module, cwd)
    assert done.returncode == 0 and "func.func @train_step" in (cwd / "step.mlir").read_text(), done.stderr[-2000:]
    # The block's `-o /dev/null` writes into a twin of it here: never the machine's own, which an
    # output written by renaming a file over it would replace (tests/test_safety.py).
    null = cwd / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    checked = set()
    for command in commands:
        done = run(command.replace("-o /dev/null", f"-o {null}"), cwd)
        assert stat.S_ISCHR(os.lstat(null).st_mode), f"{command} replaced the device it wrote to"
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, command
        (key,) = [k for k in POCK_OPT_OUTPUTS if k in command] or [None]
        assert key is not None, f"no expected output for docs/pock-opt.md's `{command}`: add one to POCK_OPT_OUTPUTS"
        POCK_OPT_OUTPUTS[key](done, cwd)
        checked.add(key)
    assert checked == set(POCK_OPT_OUTPUTS), f"docs/pock-opt.md no longer shows {set(POCK_OPT_OUTPUTS) - checked}"


def _lowered(done, cwd):
    lowered = (cwd / "out.mlir").read_text()
    assert "pock.grad" not in lowered and "pock.sgd" not in lowered and "torch.aten.mm" in lowered


def _every_chunk_failed_as_annotated(done, cwd):
    assert "expected-error" in (cwd / "lit_tests/dialect/invalid.mlir").read_text()
    assert done.stdout == "" and done.stderr == ""


def _report(done, cwd):
    assert "sparse backpropagation report: @train_step" in done.stdout and "6 of 6 parameters trained" in done.stdout


def _passes(done, cwd):
    assert "pock-autodiff:" in done.stdout and "pock-sparse-bp:" in done.stdout


def _dumps(done, cwd):
    assert "IR Dump After InlinerPass" in done.stderr and "IR Dump After pock-autodiff" in done.stderr


def _irdl(done, cwd):
    assert "irdl.dialect @pock" in (cwd / "pock.irdl.mlir").read_text()


def _iree_opt_reads_pock_ir(done, cwd):
    assert '"pock.grad"' in done.stdout


# What each command of the pock-opt block must produce, by a part of the command unique to it.
POCK_OPT_OUTPUTS = {
    "-o out.mlir": _lowered,
    "--pock-report": _report,
    "--list-passes": _passes,
    "--verify-diagnostics": _every_chunk_failed_as_annotated,
    "--mlir-print-ir-after-all": _dumps,
    "--emit-irdl": _irdl,
    "iree-opt --irdl-file": _iree_opt_reads_pock_ir,
}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A scratch repository root in which the Deploying block's commands but the qemu one have run
    (each of its models compiled once); returns (directory, the qemu commands)."""
    commands = doc_commands("docs/targets-and-deploying.md", "## Deploying to a device")
    cwd = user_directory(tmp_path_factory.mktemp("deploying"))
    needs_qemu = [c for c in commands if "qemu-aarch64" in c]
    for command in commands:
        if command in needs_qemu:
            continue
        done = run(command, cwd)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        if command.startswith("pock-train"):
            assert "epoch 5/5" in done.stderr + done.stdout, done.stderr[-2000:]
        if command.startswith("pock-compile"):  # stages on a terminal only (tests/test_tools.py)
            assert "exporting the model" not in done.stderr and "[pock]" not in done.stderr, done.stderr
    return cwd, needs_qemu


def test_deploying_block(deployed):
    cwd, needs_qemu = deployed
    assert (cwd / "run.ckpt").is_file() and (cwd / "bundle" / "tuned.safetensors").is_file()
    assert (cwd / "bundle-arm" / "manifest.json").is_file()
    missing = [
        what
        for what, found in (
            ("qemu-aarch64 (Debian qemu-user)", shutil.which("qemu-aarch64")),
            ("the aarch64 C library (Debian libc6-arm64-cross)", Path("/usr/aarch64-linux-gnu/lib").is_dir()),
            ("IREE's aarch64 iree-run-module", list((REPO / ".cache" / "iree-aarch64").glob("*/iree-run-module"))),
        )
        if not found
    ]
    if missing:
        pytest.skip(f"the qemu line needs {', '.join(missing)}; make test installs them (tools/setup_device_deps.sh)")
    for command in needs_qemu:
        done = run(command, cwd)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    # The oracle: the host bundle's first step on the same batch (args/batch) through the Python runtime.
    host = Trainer.from_bundle(cwd / "bundle")
    batch = cwd / "bundle" / "args" / "batch"
    want = host.step(np.load(batch / "input0.npy"), np.load(batch / "target.npy"))
    assert float(np.load(cwd / "arm-out" / "loss.npy")) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(
        np.load(cwd / "arm-out" / "params" / "4.weight.npy"), host.state_dict()["4.weight"], rtol=1e-5, atol=1e-6
    )
    assert not (cwd / "arm-out" / "params" / "0.weight.npy").exists()  # frozen under last-2


def test_run_step_names_a_missing_runtime(deployed, tmp_path):
    """From another directory, a relative runtime path is reported instead of failing silently; so
    are a command that does not exist and one that fails."""
    cwd, _ = deployed
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    for runtime, code, said in (
        (".cache/iree-aarch64/3.13.0/iree-run-module", 127, "does not exist"),
        ("no-such-iree-run-module", 127, "not found"),
        ("iree-run-module --no-such-flag", 1, "failed with exit code 1"),
    ):
        done = subprocess.run(
            ["sh", str(cwd / "bundle" / "run_step.sh"), "out"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=dict(env, IREE_RUN_MODULE=runtime),
        )
        assert done.returncode == code and said in done.stderr and runtime in done.stderr, done.stderr
        assert not (tmp_path / "out" / "loss.npy").exists()


def test_federated_block(tmp_path):
    """The quick comparison, then a federation of its bundle and client files with pock-federate."""
    commands = doc_commands("docs/federated.md", "## Running a federation")
    assert [c.split()[:2] for c in commands] == [
        ["python", "examples/quality/federated.py"],
        ["pock-federate", "fed/bundles/sparse"],
    ]
    cwd = user_directory(tmp_path)
    for command in commands:
        done = run(command, cwd)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (
            f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    assert "sparse | FedAvg, 2 clients" in (cwd / "quality_quick" / "federated.md").read_text()
    assert "round 2/2: accuracy" in done.stdout
    results = json.loads((cwd / "fed" / "again" / "federated.json").read_text())
    assert results["finished"] and [row["replies"] for row in results["rounds"][1:]] == [2, 2]
    assert (cwd / "fed" / "again" / "global.safetensors").is_file()


def test_llm_steps_by_hand(tmp_path):
    """The quick run of examples/llama_text.py (the whole LLM path), then its compile and
    fine-tuning by hand: the tuned weights differ from the pretrained ones (a PyTorch state_dict)
    in what transformer-last-2 trains, and only there."""
    commands = doc_commands("docs/llm-fine-tuning.md", "## The steps by hand")
    assert [c.split()[0] for c in commands] == [
        "python",
        "LLAMA_TEXT_WEIGHTS=llama_text_quick/pretrained.pt",
        "pock-train",
    ]
    cwd = user_directory(tmp_path)
    quick, *by_hand = [run(command, cwd) for command in commands]
    for command, done in zip(commands, [quick, *by_hand]):
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{command}\n{done.stderr[-2000:]}"
    # The quick run's whole path: pretraining, the host bundle (no other target unless asked), and
    # ten fine-tuning steps that lower the held-out loss.
    assert "pretrain step    20/20" in quick.stdout and "trained 10 steps in all" in quick.stdout
    before, after = (float(x) for x in re.findall(r"(?:before|after) fine-tuning:\s+([0-9.]+)", quick.stdout))
    assert after < before, quick.stdout
    run_dir = cwd / "llama_text_quick"
    assert (run_dir / "host" / "tuned.safetensors").is_file() and not (run_dir / "aarch64").exists()
    done = by_hand[-1]
    assert "epoch 1/1" in done.stderr + done.stdout and (cwd / "llama_text_quick" / "by-hand.ckpt").is_file()
    bundle = cwd / "llama_text_quick" / "by-hand"
    trained = set(Trainer.from_bundle(bundle).signature.trainable)
    tuned = load_file(bundle / "tuned.safetensors")
    pretrained = {name: value.numpy() for name, value in torch.load(cwd / "llama_text_quick" / "pretrained.pt").items()}
    assert set(tuned) == set(pretrained) and trained < set(pretrained)
    changed = {name for name in pretrained if not np.array_equal(tuned[name], pretrained[name])}
    assert changed == trained, (
        f"changed but frozen: {sorted(changed - trained)}; trained but unchanged: {sorted(trained - changed)}"
    )


def test_contributing_test_commands():
    """CONTRIBUTING's commands run from the repository root, as it says."""
    for command in doc_commands("docs/CONTRIBUTING.md", "## Tests"):
        done = run(command, REPO)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
