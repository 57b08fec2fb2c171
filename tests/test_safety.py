"""Hostile files, bad data and faults: a clear error, and nothing lost or overwritten (#19)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.bundle import BundleError, check_destination, write_bundle
from pock_mlir.files import OutputError, atomic_write
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
    return pock.compile_training(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)), *batch,
                                 optimizer=pock.SGD(lr=0.1, momentum=0.9))


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
    with pytest.raises(OutputError, match=f"cannot write {tmp_path}/missing/out: directory {tmp_path}/missing does not exist"):
        atomic_write(tmp_path / "missing" / "out", b"x")
    with pytest.raises(OutputError, match="it is a directory"):
        atomic_write(tmp_path, b"x")


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
