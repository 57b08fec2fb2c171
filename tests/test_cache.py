"""The compile cache (pock_mlir/cache.py): a second compilation of the same program takes IREE's
output from the cache, identical and working; anything that changes IREE's input misses; a
damaged entry is recompiled; the switch turns it off; a failure under the aggressive fusion
chosen is kept."""

import hashlib
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir import cache

OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)
X, Y = torch.randn(8, 6, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


def compile_mlp(**options):
    """The module of every function, whose compile_report lines have no module named."""
    torch.manual_seed(0)
    return pock.compile_training(
        nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)),
        X,
        Y,
        optimizer=OPTIMIZER,
        **{"functions": "all", **options},
    )


def entries(root):
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_second_compilation_comes_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POCK_MLIR_CACHE_DIR", str(tmp_path))
    first = compile_mlp()
    assert "iree: code generation" in first.timings and len(entries(tmp_path)) == 2
    second = compile_mlp()
    assert "iree: from the compile cache" in second.timings and "iree: code generation" not in second.timings
    assert second.vmfb == first.vmfb and second.in_place == first.in_place
    steps = [[program.trainer().step(X, Y) for _ in range(2)] for program in (first, second)]
    assert steps[0] == steps[1]

    changed = compile_mlp(iree_flags=("--iree-opt-const-eval=false",))  # other flags: another entry
    assert "iree: code generation" in changed.timings and len(entries(tmp_path)) == 4

    # the Trainer's step module (compile_training's default) is another entry, cached alike
    step = "iree (train_step_into, loss, evaluate)"
    assert f"{step}: code generation" in compile_mlp(functions=("step",)).timings and len(entries(tmp_path)) == 6
    assert f"{step}: from the compile cache" in compile_mlp(functions=("step",)).timings


# IREE 3.13's output under data tiling with aggressive fusion (the MLP's choice on some CPUs) varies
# between compilations of one input (two different modules in six), so the bytes compare under the default
DEFAULT_FUSION = ("--iree-dispatch-creation-enable-aggressive-fusion=false",)


def test_a_damaged_entry_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("POCK_MLIR_CACHE_DIR", str(tmp_path))
    good = compile_mlp(iree_flags=DEFAULT_FUSION).vmfb
    module = next(tmp_path.glob("*.vmfb"))
    module.write_bytes(good[: len(good) // 2])
    again = compile_mlp(iree_flags=DEFAULT_FUSION)
    assert "iree: code generation" in again.timings and again.vmfb == good
    assert module.read_bytes() == good  # repaired
    assert np.isfinite(again.trainer().step(X, Y))


@pytest.mark.parametrize("switch", ["option", "environment"])
def test_the_switch_turns_it_off(tmp_path, monkeypatch, switch):
    monkeypatch.setenv("POCK_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    if switch == "environment":
        monkeypatch.setenv("POCK_MLIR_CACHE", "off")
    for _ in range(2):
        program = compile_mlp(cache=switch != "option")
        assert "iree: code generation" in program.timings
    assert entries(tmp_path / "cache") == []


def test_an_unwritable_cache_warns_and_compiles(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("POCK_MLIR_CACHE_DIR", str(tmp_path / "file" / "cache"))  # under a file: cannot exist
    with pytest.warns(UserWarning, match="compile cache .* cannot be written.*POCK_MLIR_CACHE"):
        program = compile_mlp()
    assert np.isfinite(program.trainer().step(X, Y))


def test_the_default_location_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("POCK_MLIR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.directory() == tmp_path / "pock-mlir"


def test_host_code_is_keyed_by_this_cpu(monkeypatch):
    """A cache directory shared by machines must not hand AVX-512 code to a CPU without it."""
    host, aarch64 = ["--iree-llvmcpu-target-cpu=host"], ["--iree-llvmcpu-target-triple=aarch64-linux-gnu"]
    here = {flags[0]: cache.key("module {}", flags) for flags in (host, aarch64)}
    monkeypatch.setattr(cache, "_host_cpu", lambda: "another CPU")
    assert cache.key("module {}", host) != here[host[0]]
    assert cache.key("module {}", aarch64) == here[aarch64[0]]


def test_the_cache_keeps_the_most_recently_used_within_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "MAX_BYTES", 3000)
    for i, entry in enumerate("abc"):
        cache.store(tmp_path, entry, bytes(1000), {"in_place": ["optimizer"]})
        for path in tmp_path.glob(f"{entry}.*"):
            os.utime(path, (i, i))  # a older than b older than c
    assert cache.load(tmp_path, "a") is None and cache.load(tmp_path, "b") is not None
    assert cache.load(tmp_path, "c") == (
        bytes(1000),
        {"in_place": ["optimizer"], "sha256": hashlib.sha256(bytes(1000)).hexdigest()},
    )


def test_a_failure_is_kept_and_a_damaged_record_of_one_is_none(tmp_path):
    """What TrainingProgram.module() keeps where IREE failed under the aggressive fusion chosen
    (tests/test_program_flags.py compiles such a program twice)."""
    cache.store_failure(tmp_path, "a", "'func.func' op exceeded stack allocation limit")
    assert cache.failure(tmp_path, "a") == "'func.func' op exceeded stack allocation limit"
    assert cache.failure(tmp_path, "b") is None and cache.load(tmp_path, "a") is None  # a failure is no module
    for damaged in ("{", "[]", '{"error": 1}'):
        (tmp_path / "a.failed.json").write_text(damaged)
        assert cache.failure(tmp_path, "a") is None
