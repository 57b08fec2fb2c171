"""Hostile files, bad data and faults: a clear error, and nothing lost or overwritten (#19)."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.bundle import check_destination, write_bundle
from pock_mlir.files import OutputError, atomic_write, staging_directory
from pock_mlir.runtime.bundle import BundleError, load_bundle
from pock_mlir.runtime.trainer import FEW_VALUES
from pock_mlir.tools import pock_train

VENV_BIN = Path(sys.executable).parent
BATCH = 8


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, 6, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


@pytest.fixture(scope="module")
def program(batch):
    torch.manual_seed(0)
    return pock.compile_training(
        nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)),
        *batch,
        optimizer=pock.SGD(lr=0.1, momentum=0.9),
        functions="all",
    )  # trainers' and bundles


def bundle_at(program, batch, directory) -> Path:
    return write_bundle(program, directory, example_inputs=batch[0], example_target=batch[1], loss="cross_entropy")


@pytest.fixture(scope="module")
def bundle(program, batch, tmp_path_factory):
    return bundle_at(program, batch, tmp_path_factory.mktemp("safety") / "bundle")


@pytest.fixture
def own_bundle(bundle, tmp_path):
    """A copy of the bundle a test may write into (pock-train exports into it by default)."""
    return Path(shutil.copytree(bundle, tmp_path / "bundle"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("data") / "data.npz"
    np.savez(path, x_train=rng.normal(size=(24, 6)).astype(np.float32), y_train=rng.integers(0, 4, 24))
    return path


def run(command: str, *arguments) -> subprocess.CompletedProcess:
    return subprocess.run([VENV_BIN / command, *map(str, arguments)], capture_output=True, text=True)


# -- 1. writes never follow a planted link ---------------------------------------------------


def test_atomic_write_replaces_a_symlink_not_what_it_points_to(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out").symlink_to(victim)
    atomic_write(tmp_path / "out", b"new")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]  # no temporary file left


def test_pock_train_never_writes_through_planted_temporary_names(own_bundle, data, tmp_path):
    """The names the temporary files of the export and the checkpoint had before: a bundle that
    ships links under them must not make pock-train overwrite what they point to."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (".tuned.safetensors.tmp", ".run.ckpt.tmp"):
        (own_bundle / name).symlink_to(victim)
    result = run("pock-train", own_bundle, "--data", data, "--epochs", 1, "--checkpoint", own_bundle / "run.ckpt")
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    assert (own_bundle / "tuned.safetensors").is_file() and (own_bundle / "run.ckpt").is_file()


def test_output_errors_name_the_path(tmp_path):
    with pytest.raises(
        OutputError, match=f"cannot write {tmp_path}/missing/out: directory {tmp_path}/missing does not exist"
    ):
        atomic_write(tmp_path / "missing" / "out", b"x")
    with pytest.raises(OutputError, match="it is a directory"):
        atomic_write(tmp_path, b"x")


# -- 1b. a device or FIFO is written through, never replaced ------------------------------------
# On twins made in tmp_path (root makes device nodes; the machine's own /dev/null is never a target).


def device_twin(path: Path, minor: int = 3, kind: int = stat.S_IFCHR) -> Path:
    """A device node of the memory driver (1, 3: /dev/null; 1, 7: /dev/full) at `path`."""
    try:
        os.mknod(path, kind | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def is_device(path: Path, minor: int = 3) -> bool:
    info = os.lstat(path)
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, minor)


class FifoReader:
    """A FIFO at `path` and a thread reading everything written into it."""

    def __init__(self, path: Path):
        os.mkfifo(path)
        self.path, self.data = path, b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.path, "rb") as f:
            self.data = f.read()

    def received(self) -> bytes:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "nothing closed the FIFO"
        assert stat.S_ISFIFO(os.lstat(self.path).st_mode), "the FIFO was replaced"
        return self.data


def test_atomic_write_writes_through_a_device(tmp_path):
    null = device_twin(tmp_path / "null")
    atomic_write(null, b"x" * 100_000)
    assert is_device(null) and os.listdir(tmp_path) == ["null"]  # no temporary file either
    full = device_twin(tmp_path / "full", minor=7)  # written for real: /dev/full refuses every byte
    with pytest.raises(OutputError, match=f"cannot write {full}: No space left on device"):
        atomic_write(full, b"x")
    assert is_device(full, minor=7)


def test_atomic_write_writes_through_a_fifo(tmp_path):
    fifo = FifoReader(tmp_path / "fifo")
    atomic_write(fifo.path, b"through the pipe")
    assert fifo.received() == b"through the pipe" and os.listdir(tmp_path) == ["fifo"]


def test_a_symlink_to_a_device_is_replaced_not_the_device(tmp_path):
    null = device_twin(tmp_path / "null")
    (tmp_path / "out").symlink_to(null)
    atomic_write(tmp_path / "out", b"new")
    assert is_device(null) and (tmp_path / "out").read_bytes() == b"new" and not (tmp_path / "out").is_symlink()


def test_other_special_files_and_directories_onto_devices_are_refused(tmp_path):
    block = device_twin(tmp_path / "block", minor=0, kind=stat.S_IFBLK)  # never opened: refused first
    with pytest.raises(OutputError, match=f"cannot write {block}: it is a block device; give a file name"):
        atomic_write(block, b"x")
    null = device_twin(tmp_path / "null")
    with pytest.raises(OutputError, match="it is a character device; give a directory name"):
        staging_directory(null)
    with pytest.raises(BundleError, match="exists and is not a directory"):
        check_destination(null)
    assert is_device(null) and stat.S_ISBLK(os.lstat(block).st_mode)


def test_pock_opt_writes_through_a_device_a_fifo_and_stdout(tmp_path):
    null = device_twin(tmp_path / "null")
    result = run("pock-opt", "--emit-irdl", "-o", null)
    assert result.returncode == 0 and result.stderr == "" and is_device(null), result.stderr
    fifo = FifoReader(tmp_path / "fifo")
    result = run("pock-opt", "--emit-irdl", "-o", fifo.path)
    assert result.returncode == 0, result.stderr
    stdout = run("pock-opt", "--emit-irdl", "-o", "-").stdout
    assert "irdl.dialect @pock" in stdout and fifo.received().decode() == stdout


def test_pock_train_exports_through_a_device_and_a_fifo(own_bundle, data, tmp_path):
    from safetensors.numpy import load

    null = device_twin(tmp_path / "null")
    result = run("pock-train", own_bundle, "--data", data, "--epochs", 1, "--export", null)
    assert result.returncode == 0 and is_device(null), result.stderr
    fifo = FifoReader(tmp_path / "fifo")
    result = run("pock-train", own_bundle, "--data", data, "--epochs", 1, "--export", fifo.path)
    assert result.returncode == 0, result.stderr
    exported = load(fifo.received())
    assert sorted(exported) == sorted(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)).state_dict())


def test_pock_compile_refuses_a_device_as_the_bundle(tmp_path):
    null = device_twin(tmp_path / "null")
    result = run("pock-compile", Path(__file__).parent.parent / "examples" / "mlp_digits.py", "-o", null)
    assert result.returncode == 1 and "exists and is not a directory" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and is_device(null)


# -- 2. pock-compile replaces only a bundle, and keeps what it did not write ------------------


def test_a_foreign_manifest_does_not_make_a_bundle(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({"name": "someone else's"}))
    (foreign / "NOTES.txt").write_text("mine")
    with pytest.raises(BundleError, match="is not a pock bundle"):
        check_destination(foreign)
    result = run("pock-compile", Path(__file__).parent.parent / "examples" / "mlp_digits.py", "-o", foreign)
    assert result.returncode == 1 and "is not a pock bundle" in result.stderr, result.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["NOTES.txt", "manifest.json"]


def test_recompiling_keeps_the_files_besides_the_bundle(program, batch, own_bundle):
    (own_bundle / "tuned.safetensors").write_bytes(b"trained weights")
    (own_bundle / "run.ckpt").write_bytes(b"a checkpoint")
    (own_bundle / "module.vmfb").write_bytes(b"stale")
    bundle_at(program, batch, own_bundle)
    assert (own_bundle / "tuned.safetensors").read_bytes() == b"trained weights"
    assert (own_bundle / "run.ckpt").read_bytes() == b"a checkpoint"
    assert (own_bundle / "module.vmfb").read_bytes() == program.vmfb
    assert not [p for p in own_bundle.parent.iterdir() if p.name.startswith(".")]  # nothing staged left


# -- 3. every bundle file is checked before anything runs -------------------------------------


def edit_manifest(bundle: Path, edit) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda b: b.joinpath("params.safetensors").write_bytes(
                b.joinpath("params.safetensors").read_bytes()[:-64] + np.full(16, np.nan, np.float32).tobytes()
            ),
            "params.safetensors is not the file the manifest describes",
        ),
        (lambda b: b.joinpath("args", "optimizer", "step.npy").unlink(), "step.npy is missing or not a regular file"),
        (lambda b: b.joinpath("functions.json").unlink(), "functions.json is missing or not a regular file"),
        (
            lambda b: edit_manifest(b, lambda m: m["params"][0].update(shape=[3, "x"])),
            "shape must be a list of non-negative integers",
        ),
        (lambda b: edit_manifest(b, lambda m: m.update(trainable=["0.weight", "ghost"])), "trainable names ghost"),
        (lambda b: edit_manifest(b, lambda m: m.update(updated_buffers=["nowhere"])), "updated_buffers names nowhere"),
        (lambda b: edit_manifest(b, lambda m: m["output"].update(shape=[])), "its output has no shape"),
        (
            lambda b: edit_manifest(b, lambda m: m["sha256"].update({"../outside": "0" * 64})),
            "a file outside the bundle",
        ),
        (
            lambda b: b.joinpath("manifest.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}"),
            "nests too deep",
        ),
    ],
)
def test_damaged_bundles_are_refused_before_anything_runs(own_bundle, data, damage, message):
    damage(own_bundle)
    result = run("pock-train", own_bundle, "--data", data)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (own_bundle / "tuned.safetensors").exists()


def test_a_corrupt_module_with_a_fixed_up_hash_is_a_clear_error(own_bundle, data):
    import hashlib

    vmfb = bytearray((own_bundle / "module.vmfb").read_bytes())
    vmfb[:16] = bytes(16)  # the flatbuffer's header
    (own_bundle / "module.vmfb").write_bytes(vmfb)
    edit_manifest(own_bundle, lambda m: m["sha256"].update({"module.vmfb": hashlib.sha256(vmfb).hexdigest()}))
    result = run("pock-train", own_bundle, "--data", data)
    assert result.returncode == 1 and "the module is corrupt" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- 4. checkpoints: one writer, validated progress, regular files ----------------------------


def test_a_second_run_on_one_checkpoint_is_refused(own_bundle, data, tmp_path):
    import fcntl

    checkpoint = tmp_path / "run.ckpt"
    with open(tmp_path / ".run.ckpt.lock", "w") as lock:  # what a running pock-train holds
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run("pock-train", own_bundle, "--data", data, "--checkpoint", checkpoint)
    assert result.returncode == 1 and f"another pock-train is writing {checkpoint}" in result.stderr, result.stderr
    assert not checkpoint.exists()
    assert pock_train.main([str(own_bundle), "--data", str(data), "--checkpoint", str(checkpoint)]) == 0  # released


@pytest.mark.parametrize(
    "progress, message",
    [
        ({"epoch": 0, "batch": -15, "shuffle_seed": 0, "train_samples": 24, "dropout_seed": 0}, "batch must be"),
        ({"epoch": True, "batch": 0, "shuffle_seed": 0, "train_samples": 24, "dropout_seed": 0}, "epoch must be"),
        ({"epoch": 0, "batch": 7, "shuffle_seed": 0, "train_samples": 24, "dropout_seed": 0}, "an epoch has 3 batches"),
        ([1, 2], "not pock-train's record"),
    ],
)
def test_crafted_checkpoint_progress_is_refused(own_bundle, data, tmp_path, progress, message):
    from pock_mlir.checkpoint import save_checkpoint
    from pock_mlir.runtime import Trainer
    from pock_mlir.runtime.bundle import load_bundle

    bundle = load_bundle(own_bundle)
    checkpoint = tmp_path / "crafted.ckpt"
    save_checkpoint(checkpoint, Trainer.from_bundle(bundle), progress, bundle.module_sha256)
    result = run("pock-train", own_bundle, "--data", data, "--checkpoint", checkpoint, "--resume")
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_a_checkpoint_that_is_not_a_regular_file_is_refused(own_bundle, data):
    result = run("pock-train", own_bundle, "--data", data, "--checkpoint", "/dev/zero", "--resume")
    assert result.returncode == 1 and "/dev/zero is not a regular file" in result.stderr, result.stderr


# -- 5. class indices and token ids are checked on the host -----------------------------------


@pytest.mark.parametrize(
    "label, message",
    [
        (12, "target[3] = 12 is not a class index: the model has 4 classes"),
        (10**9, "target[3] = 1000000000 is not a class index"),
        (-1, "target[3] = -1 is not a class index"),
    ],
)
def test_class_labels_out_of_range_are_refused(program, batch, label, message):
    from pock_mlir.runtime import InputError

    trainer = program.trainer()
    x, y = batch
    y = y.clone()
    y[3] = label
    with pytest.raises(InputError, match=re.escape(message)):
        trainer.step(x, y)
    assert trainer.steps_taken == 0


def test_ignore_index_is_a_valid_label(program, batch):
    trainer = program.trainer()
    x, y = batch
    y = y.clone()
    y[0] = -100
    assert np.isfinite(trainer.step(x, y))


@pytest.mark.parametrize("size", [1, FEW_VALUES, FEW_VALUES + 1, 500])  # Python ints, then numpy reductions
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("planted", [None, 0, 6, 7, 300, -1, -100])
def test_the_class_index_check_refuses_exactly_the_values_outside_the_classes(size, dtype, planted):
    from pock_mlir.runtime import InputError
    from pock_mlir.runtime.trainer import IGNORE_INDEX, check_class_indices, check_token_ids

    values = np.random.default_rng(size).integers(0, 7, size)
    if planted is not None:
        values[size // 2] = planted
    values = values.astype(dtype)  # uint8 wraps -1, -100 and 300 as the device would read them
    outside = ((values < 0) | (values >= 7)) & (values != IGNORE_INDEX)
    for check, refused in (
        (check_class_indices, outside.any()),
        (check_token_ids, ((values < 0) | (values >= 7)).any()),
    ):
        if refused:
            with pytest.raises(InputError):
                check(values, 7, "target")
        else:
            check(values, 7, "target")


def test_pock_train_checks_the_labels_before_training(own_bundle, tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 24)
    y[5] = 12
    np.savez(
        tmp_path / "bad.npz",
        x_train=rng.normal(size=(24, 6)).astype(np.float32),
        y_train=y,
        x_val=rng.normal(size=(8, 6)).astype(np.float32),
        y_val=np.full(8, 2**40),
    )
    result = run("pock-train", own_bundle, "--data", tmp_path / "bad.npz")
    assert result.returncode == 1, result.stderr
    assert "y_train[5] = 12 is not a class index" in result.stderr and "y_val[0] = 1099511627776" in result.stderr
    assert "epoch" not in result.stdout


class TokenModel(nn.Module):
    """ids index two embeddings (13 and 11 rows, one through a view), shifted + 1 a third: only
    ids's every value reaches an embedding as it is, so only ids is checked (against 11)."""

    def __init__(self):
        super().__init__()
        self.wide, self.narrow, self.shifted, self.out = (
            nn.Embedding(13, 8),
            nn.Embedding(11, 8),
            nn.Embedding(5, 8),
            nn.Linear(8, 4),
        )

    def forward(self, ids, shifted):
        flat = self.wide(ids.view(-1)).view(*ids.shape, 8)
        return self.out(flat.mean(1) + self.narrow(ids).mean(1) + self.shifted(shifted + 1).mean(1))


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, 11, (BATCH, 6), generator=g), torch.randint(0, 4, (BATCH, 6), generator=g)), torch.randint(
        0, 4, (BATCH,), generator=g
    )


@pytest.fixture(scope="module")
def token_program(tokens):
    torch.manual_seed(0)
    return pock.compile_training(TokenModel(), *tokens, functions="all")


@pytest.mark.parametrize(
    "token, message",
    [
        (
            11,
            "input0: its largest token id, 11, is outside the vocabulary of the embedding it indexes: 11 tokens "
            "(ids 0..10)",
        ),
        (-2, "input0: its smallest token id, -2, is outside the vocabulary"),
    ],
)
def test_token_ids_beyond_the_vocabulary_are_refused_as_pytorch_refuses_them(token_program, tokens, token, message):
    from pock_mlir.runtime import InputError

    (ids, shifted), y = tokens
    bad = ids.clone()
    bad[2, 3] = token
    with pytest.raises(IndexError):  # the oracle: eager PyTorch
        TokenModel()(bad, shifted)
    trainer = token_program.trainer()
    with pytest.raises(InputError, match=re.escape(message)):
        trainer.step((bad, shifted), y)
    assert trainer.steps_taken == 0
    edge = ids.clone()
    edge[2, 3] = 10  # the last row of the smaller embedding
    assert np.isfinite(trainer.step((edge, shifted), y))


def test_the_vocabularies_are_those_of_the_embeddings_the_ids_reach_unchanged(token_program):
    model = TokenModel()
    assert token_program.signature.vocabularies == {
        "input0": min(model.wide.num_embeddings, model.narrow.num_embeddings)
    }


def test_bundles_carry_the_vocabularies_and_pock_train_checks_them(token_program, tokens, tmp_path):
    bundle = write_bundle(
        token_program, tmp_path / "bundle", example_inputs=tokens[0], example_target=tokens[1], loss="cross_entropy"
    )
    assert load_bundle(bundle).signature.vocabularies == token_program.signature.vocabularies
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 11, (24, 6))
    ids[7, 1] = 40
    np.savez(tmp_path / "bad.npz", x0_train=ids, x1_train=rng.integers(0, 4, (24, 6)), y_train=rng.integers(0, 4, 24))
    result = run("pock-train", bundle, "--data", tmp_path / "bad.npz")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        "x0_train: its largest token id, 40, is outside the vocabulary of the embedding it indexes: 11 tokens"
        in result.stderr
        and "epoch" not in result.stdout
    )


# -- 6. a non-finite loss never reaches the weights -------------------------------------------


def test_a_nan_step_changes_nothing_and_raises(program, batch):
    from pock_mlir.runtime import NonFiniteLossError

    trainer = program.trainer()
    x, y = batch
    trainer.step(x, y)
    before, state_before = trainer.state_dict(), trainer.optimizer_state()
    poisoned = x.clone()
    poisoned[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="the loss is nan on this batch; the step was not applied"):
        trainer.step(poisoned, y)
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    for name, value in trainer.optimizer_state().items():  # the momentum too, updated in place or not
        np.testing.assert_array_equal(value, state_before[name], err_msg=name)
    skipping = program.trainer(on_nonfinite="skip")
    assert np.isnan(skipping.step(poisoned, y)) and skipping.skipped_steps == 1 and skipping.steps_taken == 0
    assert np.isfinite(skipping.step(x, y)) and skipping.steps_taken == 1


def test_pock_train_stops_on_a_nan_batch_keeping_checkpoint_and_export(own_bundle, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6)).astype(np.float32)
    y = rng.integers(0, 4, 24)
    np.savez(tmp_path / "good.npz", x_train=x, y_train=y)
    x[:, 0] = np.nan  # every batch
    np.savez(tmp_path / "nan.npz", x_train=x, y_train=y)
    checkpoint, export = tmp_path / "run.ckpt", tmp_path / "tuned.safetensors"
    assert (
        pock_train.main(
            [
                str(own_bundle),
                "--data",
                str(tmp_path / "good.npz"),
                "--checkpoint",
                str(checkpoint),
                "--export",
                str(export),
            ]
        )
        == 0
    )
    saved, exported = checkpoint.read_bytes(), export.read_bytes()
    result = run(
        "pock-train",
        own_bundle,
        "--data",
        tmp_path / "nan.npz",
        "--checkpoint",
        checkpoint,
        "--resume",
        "--epochs",
        2,
        "--export",
        export,
    )
    assert result.returncode == 1 and "the loss is nan" in result.stderr and "--on-nonfinite skip" in result.stderr
    assert f"{checkpoint} holds step 3" in result.stderr, result.stderr
    assert checkpoint.read_bytes() == saved and export.read_bytes() == exported
    result = run(
        "pock-train",
        own_bundle,
        "--data",
        tmp_path / "nan.npz",
        "--on-nonfinite",
        "skip",
        "--export",
        tmp_path / "skipped.safetensors",
    )
    assert result.returncode == 0 and "skipped 3 batch(es) with a non-finite loss" in result.stdout, result.stdout


# -- 7. values, not only shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("sgd:lr=inf", "SGD lr must be a finite number"),
        ("adamw:betas=0.9", "betas takes two numbers"),
        ("sgd:lr=0.1,nesterov=maybe", "nesterov must be true or false"),
        ("sgd:lr=0.1,lr=0.2", "lr is given twice"),
        ("sgd:lr=0.1,beta=1", "sgd has no option 'beta'"),
        ("sgd:momentum=0.9", "sgd needs lr"),
    ],
)
def test_optimizer_text_is_validated(text, message):
    from pock_mlir.optim import parse_optimizer

    with pytest.raises(ValueError, match=message):
        parse_optimizer(text)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: pock.SGD(lr="0.1"), "SGD lr must be a finite number, got '0.1'"),
        (lambda: pock.SGD(lr=0.1, momentum=float("nan")), "SGD momentum must be a finite number"),
        (lambda: pock.SGD(lr=0.1, momentum=0.9, nesterov="yes"), "SGD nesterov must be True or False"),
        (lambda: pock.AdamW(betas=(0.9,)), "AdamW betas must be two finite numbers"),
    ],
)
def test_optimizer_values_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "model, inputs, message",
    [
        (lambda: nn.Linear(6, 4).double(), torch.randn(8, 6), "the model holds float64 tensors (weight, bias)"),
        (lambda: nn.Linear(6, 4), torch.randn(8, 6, dtype=torch.float64), "input 0 is float64"),
        (lambda: nn.Linear(6, 4).half(), torch.randn(8, 6), "the model holds float16 tensors (weight, bias)"),
        (lambda: nn.Linear(6, 4).bfloat16(), torch.randn(8, 6), "the model holds bfloat16 tensors (weight, bias)"),
        (lambda: nn.Linear(6, 4), torch.randn(8, 6, dtype=torch.float16), "input 0 is float16"),
        (lambda: nn.Linear(6, 4), torch.randn(0, 6), "input 0 has shape (0, 6), with no elements"),
    ],
)
def test_models_and_batches_pock_cannot_train_are_named(model, inputs, message):
    from pock_mlir.frontend import FrontendError

    with pytest.raises(FrontendError, match=re.escape(message)):
        pock.compile_training(model(), inputs, torch.zeros(len(inputs), dtype=torch.int64))


def test_an_op_iree_cannot_compile_is_named():
    class Spectrum(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            return self.fc(torch.fft.fft(x).real)

    with pytest.raises(RuntimeError) as caught, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        pock.compile_training(Spectrum(), torch.randn(8, 6), torch.zeros(8, dtype=torch.int64))
    assert not [w for w in warned if "fusion" in str(w.message)]  # whichever fusion the host's table chose
    message = str(caught.value)
    assert message.startswith("the model uses torch.aten.fft_fft, which torch-mlir and IREE cannot compile for host")
    assert "\n" not in message


def test_pock_train_seed_is_validated(own_bundle, data):
    result = run("pock-train", own_bundle, "--data", data, "--seed", -1)
    assert result.returncode == 1 and "--seed must be a non-negative integer" in result.stderr, result.stderr


# -- 8. load_state_dict and load_optimizer_state -----------------------------------------------


def test_load_state_dict_is_strict_and_all_or_nothing(program):
    from pock_mlir.runtime import InputError

    trainer = program.trainer()
    before = trainer.state_dict()
    with pytest.raises(InputError, match="state_dict lacks 0.bias, 2.bias, 2.weight"):
        trainer.load_state_dict({"0.weight": before["0.weight"]})
    bad = {name: np.ones_like(value) for name, value in before.items()}
    bad["2.weight"] = np.ones((3, 3), np.float32)
    with pytest.raises(InputError, match=r"2.weight: expected shape \(4, 16\), got \(3, 3\)$"):
        trainer.load_state_dict(bad)
    for name, value in trainer.state_dict().items():  # nothing was replaced
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    trainer.load_state_dict({"0.bias": np.zeros(16)}, strict=False)  # float64, as numpy makes it: cast
    assert trainer.state_dict()["0.bias"].dtype == np.float32 and not trainer.state_dict()["0.bias"].any()
    with pytest.raises(InputError, match="step must be a float32 scalar counting steps"):
        trainer.load_optimizer_state({**trainer.optimizer_state(), "step": np.float32(-1)})


# -- 9. output paths are checked before training --------------------------------------------------


def test_an_unwritable_export_fails_before_training(own_bundle, data, tmp_path):
    (tmp_path / "a_directory").mkdir()
    result = run("pock-train", own_bundle, "--data", data, "--export", tmp_path / "a_directory")
    assert result.returncode == 1 and "it is a directory; give a file name" in result.stderr, result.stderr
    assert "epoch" not in result.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["a_directory", "bundle"]
    result = run("pock-train", own_bundle, "--data", data, "--export", tmp_path / "nowhere" / "t.safetensors")
    assert result.returncode == 1 and f"directory {tmp_path}/nowhere does not exist" in result.stderr
