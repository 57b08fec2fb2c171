"""pock-train checkpoints: resuming gives the uninterrupted run's results, a run killed or
interrupted while writing one leaves the previous checkpoint intact, corrupt ones are refused."""

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.numpy import load_file

import pock_mlir as pock
from pock_mlir.bundle import write_bundle
from pock_mlir.files import TEMPORARY_PREFIX
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.tools import pock_train

VENV_BIN = Path(sys.executable).parent
BATCH = 8


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """An MLP with dropout (its masks follow a seed the checkpoint must carry) trained by AdamW (two
    state slots per parameter); its checkpoints are 130 KB."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.2), nn.Linear(256, 10))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    program = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-2), functions="all")
    return write_bundle(
        program,
        tmp_path_factory.mktemp("checkpoint") / "bundle",
        example_inputs=x,
        example_target=y,
        loss="cross_entropy",
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """29 training samples: 3 batches an epoch (one sample left out, a different one each epoch)."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "data.npz"
    np.savez(
        path,
        x_train=rng.normal(size=(29, 32)).astype(np.float32),
        y_train=rng.integers(0, 10, 29),
        x_val=rng.normal(size=(16, 32)).astype(np.float32),
        y_val=rng.integers(0, 10, 16),
    )
    return path


def train(bundle, data, *arguments):
    return pock_train.main([str(bundle), "--data", str(data), "--epochs", "4", *map(str, arguments)])


def test_resumed_run_equals_the_uninterrupted_run(bundle, data, tmp_path):
    # 10 steps cross three epoch ends; the resume at step 5 starts inside the second epoch.
    assert train(bundle, data, "--max-steps", 5, "--checkpoint", tmp_path / "a.ckpt", "--export", tmp_path / "a5") == 0
    assert (
        train(
            bundle, data, "--max-steps", 10, "--checkpoint", tmp_path / "a.ckpt", "--resume", "--export", tmp_path / "a"
        )
        == 0
    )
    assert train(bundle, data, "--max-steps", 10, "--checkpoint", tmp_path / "b.ckpt", "--export", tmp_path / "b") == 0
    resumed, straight = load_file(tmp_path / "a"), load_file(tmp_path / "b")
    assert set(resumed) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)
    assert not np.array_equal(load_file(tmp_path / "a5")["3.weight"], straight["3.weight"])
    a, b = load_file(tmp_path / "a.ckpt"), load_file(tmp_path / "b.ckpt")
    assert set(a) == set(b) and "optimizer/0.weight.exp_avg_sq" in a and float(a["optimizer/step"]) == 10
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_checkpoint_layout(bundle, data, tmp_path):
    assert train(bundle, data, "--max-steps", 4, "--checkpoint", tmp_path / "c.ckpt", "--export", tmp_path / "t") == 0
    with safe_open(tmp_path / "c.ckpt", "np") as f:
        metadata, names = f.metadata(), set(f.keys())
    assert metadata["format"] == "pock-checkpoint-2"
    assert metadata["module_sha256"] == load_bundle(bundle).module_sha256
    assert names == {"model/0.weight", "model/0.bias", "model/3.weight", "model/3.bias", "optimizer/step"} | {
        f"optimizer/{p}.{slot}"
        for p in ("0.weight", "0.bias", "3.weight", "3.bias")
        for slot in ("exp_avg", "exp_avg_sq")
    }
    # 4 steps: one epoch of 3 batches, then 1 batch
    assert json.loads(metadata["progress"]) == {
        "epoch": 1,
        "batch": 1,
        "shuffle_seed": 0,
        "train_samples": 29,
        "dropout_seed": 4,
    }
    trainer = Trainer.from_bundle(bundle)
    assert trainer.steps_taken == 0
    state = load_file(tmp_path / "c.ckpt")
    trainer.load_optimizer_state(
        {n.removeprefix("optimizer/"): v for n, v in state.items() if n.startswith("optimizer/")}
    )
    assert trainer.steps_taken == 4


def test_a_checkpoint_streamed_from_the_device_holds_the_trainers_state_exactly(bundle, tmp_path):
    """save_checkpoint writes tensor by tensor from the device: safetensors' own reader finds
    state_dict() and optimizer_state() in it, bit for bit, and load_checkpoint's views of the file
    hold the same."""
    from pock_mlir.checkpoint import load_checkpoint, save_checkpoint

    loaded = load_bundle(bundle)
    trainer = Trainer.from_bundle(loaded)
    g = np.random.default_rng(2)
    trainer.step(g.normal(size=(BATCH, 32)).astype(np.float32), g.integers(0, 10, BATCH))
    save_checkpoint(tmp_path / "c.ckpt", trainer, {"epoch": 0}, loaded.module_sha256)
    expected = {f"model/{k}": v for k, v in trainer.state_dict().items()}
    expected |= {f"optimizer/{k}": v for k, v in trainer.optimizer_state().items()}
    written = load_file(tmp_path / "c.ckpt")
    assert written.keys() == expected.keys()
    checkpoint = load_checkpoint(tmp_path / "c.ckpt", loaded)
    read = {f"model/{k}": v for k, v in checkpoint.state_dict.items()}
    read |= {f"optimizer/{k}": v for k, v in checkpoint.optimizer_state.items()}
    for name, value in expected.items():
        assert written[name].dtype == value.dtype and read[name].dtype == value.dtype, name
        np.testing.assert_array_equal(written[name], value, err_msg=name)
        np.testing.assert_array_equal(read[name], value, err_msg=name)
    assert checkpoint.progress == {"epoch": 0} and checkpoint.steps == 1


def start_train(*arguments, command=(VENV_BIN / "pock-train",)) -> subprocess.Popen:
    """pock-train in a process that Ctrl-C reaches: a shell that ran the tests in the background
    (`make test &`) makes its children ignore SIGINT, which Python then leaves ignored."""
    return subprocess.Popen(
        [*command, *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


# pock-train whose first atomic write of the checkpoint goes into a FIFO the test holds: the
# temporary file's name is unique and unpredictable (pock_mlir/files.py), so the wrapper names it.
TRAIN_INTO_FIFO = """
import os, sys, tempfile
from pock_mlir.tools import pock_train
fifo, checkpoint_name, make_temporary = sys.argv[1], sys.argv[2], tempfile.mkstemp
def mkstemp(prefix, dir):
    if checkpoint_name in prefix and os.path.exists(fifo):
        return os.open(fifo, os.O_WRONLY), fifo
    return make_temporary(prefix=prefix, dir=dir)
tempfile.mkstemp = mkstemp
sys.exit(pock_train.main(sys.argv[3:]))
"""


def staged_fifo(checkpoint: Path) -> Path:
    """Where the wrapper's FIFO lies: a name like the temporary files pock-mlir writes."""
    return checkpoint.with_name(f"{TEMPORARY_PREFIX}{checkpoint.name}.fifo")


def start_checkpoint_writer(bundle, data, checkpoint):
    """A resumed pock-train caught writing its next checkpoint.

    The temporary file it writes is made a FIFO: the writer blocks once the pipe is full (the
    checkpoint is larger than a pipe's 64 KiB), mid-write, until the test acts. Returns the
    process and the FIFO's read end, from which a first byte has arrived."""
    staged = staged_fifo(checkpoint)
    os.mkfifo(staged)
    reader = os.open(staged, os.O_RDONLY | os.O_NONBLOCK)
    process = start_train(
        staged,
        checkpoint.name,
        bundle,
        "--data",
        data,
        "--epochs",
        "2",
        "--checkpoint",
        checkpoint,
        "--resume",
        command=(sys.executable, "-c", TRAIN_INTO_FIFO),
    )
    readable, _, _ = select.select([reader], [], [], 120)
    assert readable and os.read(reader, 1), "pock-train did not start writing the checkpoint"
    return process, reader


def drain_until_closed(reader, timeout: float = 60) -> None:
    """Read the FIFO until its writer closes it, as a disk would take the rest of a write.

    Linux may hand a process's SIGINT to any of its threads (IREE's workers included); when it is
    not the one blocked in write(), that write goes on until the FIFO takes it, and only then does
    Python raise KeyboardInterrupt. Either way the previous checkpoint must stay."""
    while select.select([reader], [], [], timeout)[0]:
        if not os.read(reader, 1 << 16):
            return
    raise AssertionError(f"pock-train kept the checkpoint's temporary file open for {timeout} s after the signal")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_run_stopped_mid_write_leaves_the_previous_checkpoint(bundle, data, tmp_path, how):
    checkpoint = tmp_path / "run.ckpt"
    assert train(bundle, data, "--epochs", 1, "--checkpoint", checkpoint, "--export", tmp_path / "t") == 0
    before = checkpoint.read_bytes()
    process, reader = start_checkpoint_writer(bundle, data, checkpoint)
    try:
        process.send_signal(getattr(signal, how))
        drain_until_closed(reader)
        _, stderr = process.communicate(timeout=60)
    finally:
        os.close(reader)
    if how == "SIGKILL":
        assert process.returncode == -signal.SIGKILL
        staged_fifo(checkpoint).unlink()  # what a killed run leaves behind, in place of its partial file
    else:
        assert process.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr
        assert not staged_fifo(checkpoint).exists()  # Ctrl-C removes its partial file
    assert checkpoint.read_bytes() == before
    assert train(bundle, data, "--epochs", 2, "--checkpoint", checkpoint, "--resume", "--export", tmp_path / "t") == 0
    assert float(load_file(checkpoint)["optimizer/step"]) == 6


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped byte":
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(b"not a checkpoint at all")


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", "is corrupt or not a checkpoint"),
        ("flipped byte", "is corrupt: its tensors do not match the checksum"),
        ("garbage", "is corrupt or not a checkpoint"),
    ],
)
def test_a_corrupt_checkpoint_is_refused(bundle, data, tmp_path, capsys, how, message):
    checkpoint = tmp_path / "c.ckpt"
    assert train(bundle, data, "--max-steps", 2, "--checkpoint", checkpoint, "--export", tmp_path / "t") == 0
    corrupt(checkpoint, how)
    damaged = checkpoint.read_bytes()
    capsys.readouterr()
    assert train(bundle, data, "--checkpoint", checkpoint, "--resume", "--export", tmp_path / "new") == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert checkpoint.read_bytes() == damaged and not (tmp_path / "new").exists()


def test_a_checkpoint_of_another_run_is_refused(bundle, data, tmp_path, capsys):
    checkpoint = tmp_path / "c.ckpt"
    assert train(bundle, data, "--max-steps", 2, "--checkpoint", checkpoint, "--export", tmp_path / "t") == 0
    capsys.readouterr()
    assert train(bundle, data, "--checkpoint", checkpoint, "--resume", "--seed", 7) == 1
    assert "was trained with seed 0" in capsys.readouterr().err
    np.savez(tmp_path / "fewer.npz", **{k: v[:24] for k, v in np.load(data).items()})
    assert train(bundle, tmp_path / "fewer.npz", "--checkpoint", checkpoint, "--resume") == 1
    assert "was trained on 29 samples" in capsys.readouterr().err
    assert train(bundle, data, "--checkpoint", checkpoint) == 1
    assert "exists: pass --resume" in capsys.readouterr().err


def test_ctrl_c_exports_the_weights_of_the_last_step(bundle, data, tmp_path):
    """Ctrl-C during training stops after the step under way, exports that step's weights and says
    where they and the checkpoint are; the export equals a run stopped there by --max-steps."""
    export, checkpoint = tmp_path / "interrupted.safetensors", tmp_path / "run.ckpt"
    process = start_train(bundle, "--data", data, "--epochs", "100000", "--checkpoint", checkpoint, "--export", export)
    shown = ""
    while "epoch 2/" not in shown:  # the progress bar: training is under way, a checkpoint written
        ready, _, _ = select.select([process.stderr], [], [], 120)
        assert ready, "pock-train showed no progress"
        shown += os.read(process.stderr.fileno(), 4096).decode()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    stderr = shown + stderr
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    steps = int(re.search(r"interrupted at step (\d+)", stderr)[1])
    assert f"the tuned weights of step {steps} are in {export}" in stderr
    saved = int(re.search(r"run.ckpt holds step (\d+) \(--resume continues from there\)", stderr)[1])
    assert 3 <= saved <= steps and float(load_file(checkpoint)["optimizer/step"]) == saved
    assert train(bundle, data, "--epochs", 100000, "--max-steps", steps, "--export", tmp_path / "stopped") == 0
    got, want = load_file(export), load_file(tmp_path / "stopped")
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
