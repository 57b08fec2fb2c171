"""Steps after the first allocate nothing: the intermediate values live in one workspace allocated
once (pock_mlir/runtime/workspace.py), and each step writes its new state into one of two buffer
sets the Trainer alternates (passes/pock_step_into.py)."""

import platform
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


def test_intermediate_values_stay_in_one_workspace():
    # An LM-head-like layer: its logits and their gradient (1024 x 9000 floats, 37 MB each) are
    # above glibc's largest dynamic mmap threshold (32 MiB), so when IREE allocated them per step
    # each step unmapped them and faulted ~48,000 pages back in (measured). Run in a fresh process
    # with retention off: retention is process-wide, and other tests' trainers turn it on.
    script = textwrap.dedent("""
        import numpy as np, torch, torch.nn as nn
        import pock_mlir as pock
        from tests.test_runtime_memory import faults_per_step
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 9000))
        x, y = torch.randn(1024, 64), torch.randint(0, 9000, (1024,))
        trainer = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-3)).trainer(retain_memory=False)
        print(trainer.workspace_bytes, faults_per_step(trainer, x.numpy(), y.numpy().astype(np.int32)))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    workspace_bytes, faults = done.stdout.split()
    assert int(workspace_bytes) >= 2 * 1024 * 9000 * 4  # the logits and their gradient are in it
    assert float(faults) < 0.05 * 1024 * 9000 * 4 / 4096


def test_steps_write_their_state_into_two_alternating_buffer_sets():
    # 3 x 256 x 16000 floats of parameters and AdamW moments (49 MB): when IREE allocated each
    # step's results, the process grew by another 47 MB at the second step and stayed there (a
    # third block: the old state, the new one, and the one before, not yet reused; measured).
    # Fresh process, retention off: nothing after the first step may grow the resident set.
    script = textwrap.dedent("""
        import numpy as np, torch, torch.nn as nn
        import pock_mlir as pock
        from bench.memory import rss_kb
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16000))
        x, y = torch.randn(64, 64), torch.randint(0, 16000, (64,))
        trainer = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-3)).trainer(retain_memory=False)
        trainer.step(x, y)
        after_first = rss_kb()
        for _ in range(4):
            trainer.step(x, y)
        print((rss_kb() - after_first) / 1024)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert float(done.stdout) < 2.0, f"the resident set grew by {float(done.stdout):.1f} MB after the first step"
