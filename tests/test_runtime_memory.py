"""Steps after the first do not fault their working set back in: the intermediate values live in
one workspace allocated once (pock_mlir/runtime/workspace.py), and the memory a step frees (its
previous results) stays mapped (pock_mlir/runtime/memory.py)."""

import platform
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.runtime.memory import retain_freed_memory

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


def test_retained_steps_do_not_fault_their_results_back_in():
    # Each step's results (the new parameters and AdamW moments, 3 x 256 x 16000 floats, 49 MB in
    # one block) are allocated afresh and the previous step's are freed; glibc unmaps a block that
    # large, so without retention every step faults ~12,000 pages back in (measured).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16000))
    x, y = torch.randn(64, 64), torch.randint(0, 16000, (64,))
    trainer = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-3)).trainer()
    assert retain_freed_memory()
    result_pages = 3 * 256 * 16000 * 4 / 4096
    assert faults_per_step(trainer, x.numpy(), y.numpy().astype(np.int32)) < 0.05 * result_pages
