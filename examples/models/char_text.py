"""Character-level text for the LLaMA-like examples, from this machine's Python installation.

Two corpora, so that nothing is downloaded: standard-library source code (to pretrain on) and
the standard library's documentation prose as pydoc renders it (to fine-tune on), whole or per
file and module (the text classification task's classes). Characters
are ASCII codes (vocabulary 128). Also: random next-token windows, a PyTorch pretraining loop for any batches and loss
and greedy decoding through a forward compiled for one fixed batch shape.
"""

from __future__ import annotations

import os
import pydoc
import time
from pathlib import Path

import numpy as np
import torch

VOCAB = 128  # ASCII; anything else maps to '?'
SOURCE_MODULES = [
    "collections/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "argparse.py",
    "textwrap.py",
    "string.py",
    "functools.py",
    "dataclasses.py",
]
DOC_MODULES = [
    "collections",
    "json",
    "argparse",
    "textwrap",
    "string",
    "functools",
    "itertools",
    "dataclasses",
    "pathlib",
    "shutil",
    "heapq",
    "bisect",
]


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8).astype(np.int64) % VOCAB


def decode(ids) -> str:
    return "".join(chr(int(i)) if 32 <= int(i) < 127 or int(i) == 10 else "?" for i in ids)


def source_files(names=SOURCE_MODULES) -> list[str]:
    """The text of each standard-library source file in `names` (paths under the library's root)."""
    root = Path(os.__file__).parent
    return [(root / name).read_text(encoding="utf-8", errors="replace") for name in names]


def documentation(names=DOC_MODULES) -> list[str]:
    """Each module's documentation as pydoc renders it in plain text."""
    return [pydoc.render_doc(__import__(name), renderer=pydoc.plaintext) for name in names]


def source_corpus() -> str:
    return "\n".join(source_files())


def documentation_corpus() -> str:
    return "\n".join(documentation())


def windows(tokens: np.ndarray, seq: int, batch: int, rng: np.random.RandomState):
    """A batch of (input, next-token target) windows at random offsets."""
    starts = rng.randint(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([tokens[s : s + seq] for s in starts])
    y = np.stack([tokens[s + 1 : s + seq + 1] for s in starts])
    return x, y


def pretrain(model, batches, loss_fn, steps, seed, lr=3e-3):
    """`steps` PyTorch AdamW updates (weight decay 0.01) of `model` under `loss_fn`, on the
    (input, target) batch `batches(rng)` draws each step, printing the loss, the time taken and an
    estimate of the time left every tenth of the way."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.RandomState(seed)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = batches(rng)
        opt.zero_grad()
        loss = loss_fn(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        if step % max(1, steps // 10) == 0 or step == steps:
            elapsed = time.perf_counter() - start
            print(
                f"  pretrain step {step:5d}/{steps}  loss {loss.item():.3f}  {elapsed:4.0f} s, "
                f"about {elapsed / step * (steps - step):.0f} s left",
                flush=True,
            )
    return model


def greedy_completion(predict, prompt: str, shape: tuple[int, int], length: int) -> str:
    """`length` characters after `prompt`, each the most likely next one, from `predict`: a forward
    taking (batch, seq) token ids, compiled for that fixed `shape`. Causal attention makes the
    logits at position n depend only on positions <= n, so the window is filled in place (row 0;
    the prompt keeps its last seq - length characters)."""
    batch, seq = shape
    ids = list(encode(prompt))[-(seq - length) :]
    start = len(ids)
    window = np.zeros((batch, seq), np.int64)
    window[0, :start] = ids
    for position in range(start, start + length):
        logits = predict(window)
        window[0, position] = int(np.argmax(logits[0, position - 1]))
    return decode(window[0, start : start + length])
