"""The Trainer keeps the memory a step frees mapped, so steps after the first do not fault it back in."""

import platform
import resource

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.runtime.memory import retain_freed_memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="retaining freed memory is glibc-only")


def test_retained_steps_do_not_fault_their_working_set_back_in():
    # An LM-head-like layer: the logits and their gradient (1024 x 9000 floats, 37 MB each) are
    # above glibc's largest dynamic mmap threshold (32 MiB), so without retention every step
    # unmaps them and faults ~48,000 pages back in (measured); retained, none after warm-up.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 9000))
    x, y = torch.randn(1024, 64), torch.randint(0, 9000, (1024,))
    trainer = pock.compile_training(model, x, y, optimizer=pock.AdamW(lr=1e-3)).trainer()
    assert retain_freed_memory()
    inputs, target = x.numpy(), y.numpy().astype(np.int32)
    for _ in range(3):
        trainer.step(inputs, target)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        trainer.step(inputs, target)
    faults_per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    logits_pages = 1024 * 9000 * 4 / 4096
    assert faults_per_step < 0.05 * logits_pages
