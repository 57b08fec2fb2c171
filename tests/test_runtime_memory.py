"""Steps after the first allocate nothing: the intermediate values live in one workspace allocated
once (pock_mlir/runtime/workspace.py), and each step writes its new parameters into one of two
buffer sets the Trainer alternates (passes/pock_step_into.py) and its optimizer state in place
(pock_mlir/in_place.py). Set-up leaves nothing behind: what it freed is given back
(pock_mlir/runtime/memory.py)."""

import hashlib
import math
import platform
import random
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="page-fault counts as measured with glibc")
REPO = Path(__file__).resolve().parent.parent


def faults_per_step(trainer, inputs, target, warmup=3, steps=3) -> float:
    for _ in range(warmup):
        trainer.step(inputs, target)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        trainer.step(inputs, target)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


def growth_after_first_step(trainer, inputs, target, steps=4) -> float:
    """MB the resident set grows by over `steps` steps after the first."""
    from bench.memory import rss_kb

    trainer.step(inputs, target)
    after_first = rss_kb()
    for _ in range(steps):
        trainer.step(inputs, target)
    return (rss_kb() - after_first) / 1024


def device_bytes(trainer) -> int:
    """What a trainer holds on the device: parameters and buffers, the optimizer state, a second
    set of the trainable parameters and of the state unless each is updated in place, the batch
    and the workspace."""
    sig = trainer.signature
    size = lambda spec: 4 * math.prod(spec.shape)  # noqa: E731  (every tensor of these models is 32-bit)
    params = {p.name: size(p) for p in sig.params}
    copies = {role: 1 if role in trainer.in_place else 2 for role in ("params", "optimizer")}
    return (
        sum(params.values())
        + sum(size(b) for b in sig.buffers)
        + copies["optimizer"] * sum(size(s) for s in sig.state)
        + (copies["params"] - 1) * sum(params[name] for name in sig.trainable)
        + sum(size(s) for s in sig.batch)
        + (trainer.workspace_bytes or 0)
    )


def measure_in_fresh_process(classes: int, batch: int, measure: str, retain_memory: bool = False) -> list[str]:
    """Train Linear(64, 256), ReLU, Linear(256, classes) with AdamW in a fresh process (retention
    is process-wide, and other tests' trainers turn it on); `measure` is printed, an expression of
    this module's helpers over program, trainer, x, y and rss_before (MB resident before the
    trainer was made)."""
    script = textwrap.dedent(f"""
        import numpy as np, torch, torch.nn as nn
        import pock_mlir as pock
        from bench.memory import rss_kb
        from tests.test_runtime_memory import device_bytes, faults_per_step, growth_after_first_step
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, {classes}))
        x, y = torch.randn({batch}, 64).numpy(), torch.randint(0, {classes}, ({batch},)).numpy().astype(np.int32)
        program = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-3))
        rss_before = rss_kb() / 1024
        trainer = program.trainer(retain_memory={retain_memory})
        print(*{measure})
    """)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()


def test_intermediate_values_stay_in_one_workspace():
    # An LM-head-like layer: its logits and their gradient (1024 x 9000 floats, 37 MB each) are
    # above glibc's largest dynamic mmap threshold (32 MiB), so when IREE allocated them per step
    # each step unmapped them and faulted ~48,000 pages back in (measured).
    workspace_bytes, faults = measure_in_fresh_process(
        9000, 1024, "(trainer.workspace_bytes, faults_per_step(trainer, x, y))"
    )
    assert int(workspace_bytes) >= 2 * 1024 * 9000 * 4  # the logits and their gradient are in it
    assert float(faults) < 0.05 * 1024 * 9000 * 4 / 4096


def test_steps_write_their_state_into_two_alternating_buffer_sets():
    # 3 x 256 x 16000 floats of parameters and AdamW moments (49 MB): when IREE allocated each
    # step's results, the process grew by another 47 MB at the second step and stayed there (a
    # third block: the old state, the new one, and the one before, not yet reused; measured).
    # Nothing after the first step may grow the resident set.
    (growth,) = measure_in_fresh_process(16000, 64, "(growth_after_first_step(trainer, x, y),)")
    assert float(growth) < 2.0, f"the resident set grew by {float(growth):.1f} MB after the first step"


def test_set_up_gives_back_what_it_freed():
    # With retention on, the host zeros the trainer uploads as optimizer state and spare buffers
    # stayed resident after upload (measured with the state in two sets: 128 MB for 106 MB of
    # device data, 97 MB after the release). Only what the trainer holds on the device may stay.
    growth, held = measure_in_fresh_process(
        16000, 64, "(rss_kb() / 1024 - rss_before, device_bytes(trainer) / 2**20)", retain_memory=True
    )
    assert float(growth) < float(held) + 8, (
        f"set-up left {float(growth):.0f} MB resident for {float(held):.0f} MB of device data"
    )


def test_a_trainers_cpu_workers_hold_little_local_memory():
    """IREE's task executor gives each worker local memory the size of its core's L2 cache by
    default, resident once touched; a trainer's device gives each WORKER_LOCAL_MEMORY
    (pock_mlir/runtime/memory.py). Both devices are made in one fresh process, IREE's own first
    (the setting is process-wide)."""
    l2 = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    if not l2.exists():
        pytest.skip("no L2 cache size in sysfs")
    code = textwrap.dedent(
        """
        import iree.runtime as rt
        from bench.memory import rss_kb
        from pock_mlir.runtime.memory import new_device
        before = rss_kb()
        stock = rt.get_device("local-task", cache=False)
        after_stock = rss_kb()
        ours = new_device("local-task")
        print(after_stock - before, rss_kb() - after_stock)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    stock_kb, ours_kb = map(int, result.stdout.split())
    l2_kb = int(l2.read_text().strip().rstrip("K"))
    assert stock_kb >= l2_kb, (stock_kb, l2_kb)  # IREE's default: at least one worker's L2 resident
    assert ours_kb < stock_kb - l2_kb // 2, (ours_kb, stock_kb)


def test_checking_a_bundles_hashes_leaves_mallocs_mmap_threshold_alone(tmp_path):
    """glibc raises its mmap threshold to the size of a mapped block that is freed: hashing the
    bundle's files in 1 MiB reads did so, and what the Trainer then allocated below 1 MiB went on
    the heap and stayed (0.95 MB of MobileNetV3's deployed process). After hashing a 4 MiB file,
    a 512 KiB block is still mapped (mallinfo2's hblkhd: bytes in mapped blocks), in a fresh
    process (the threshold is process-wide)."""
    big = tmp_path / "big.bin"
    big.write_bytes(random.Random(0).randbytes((4 << 20) + 12345))  # not a whole number of reads
    expected = hashlib.sha256(big.read_bytes()).hexdigest()
    code = textwrap.dedent(
        f"""
        import ctypes
        from pock_mlir.runtime.bundle import file_sha256

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = MallInfo2
        assert file_sha256({str(big)!r}) == {expected!r}
        before = libc.mallinfo2().hblkhd
        block = bytearray(512 << 10)
        print(libc.mallinfo2().hblkhd - before)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert int(result.stdout) >= 512 << 10, "a 512 KiB block went on the heap after hashing"
