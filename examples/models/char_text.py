"""Character-level text for the LLaMA-like examples, from this machine's Python installation.

Two corpora, so that nothing is downloaded: standard-library source code (to pretrain on) and
the standard library's documentation prose as pydoc renders it (to fine-tune on). Characters
are ASCII codes (vocabulary 128). Also: random next-token windows, a PyTorch pretraining loop
and greedy decoding through a forward compiled for one fixed batch shape.
"""

from __future__ import annotations

import os
import pydoc
import time
from pathlib import Path

import numpy as np
import torch

from .transformer import token_cross_entropy

VOCAB = 128  # ASCII; anything else maps to '?'
SOURCE_MODULES = ["collections/__init__.py", "json/decoder.py", "json/encoder.py", "argparse.py", "textwrap.py",
                  "string.py", "functools.py", "dataclasses.py"]
DOC_MODULES = ["collections", "json", "argparse", "textwrap", "string", "functools", "itertools", "dataclasses",
               "pathlib", "shutil", "heapq", "bisect"]


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8).astype(np.int64) % VOCAB


def decode(ids) -> str:
    return "".join(chr(int(i)) if 32 <= int(i) < 127 or int(i) == 10 else "?" for i in ids)


def source_corpus() -> str:
    root = Path(os.__file__).parent
    return "\n".join((root / name).read_text(encoding="utf-8", errors="replace") for name in SOURCE_MODULES)


def documentation_corpus() -> str:
    return "\n".join(pydoc.render_doc(__import__(name), renderer=pydoc.plaintext) for name in DOC_MODULES)


def windows(tokens: np.ndarray, seq: int, batch: int, rng: np.random.RandomState):
    """A batch of (input, next-token target) windows at random offsets."""
    starts = rng.randint(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([tokens[s:s + seq] for s in starts])
    y = np.stack([tokens[s + 1:s + seq + 1] for s in starts])
    return x, y


def pretrain(model, tokens, cfg, steps, batch, seed):
    """`steps` PyTorch AdamW updates on random windows of `tokens`, printing the loss, the time
    taken and an estimate of the time left every tenth of the way."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.RandomState(seed)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = windows(tokens, cfg.max_len, batch, rng)
        opt.zero_grad()
        loss = token_cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        if step % max(1, steps // 10) == 0 or step == steps:
            elapsed = time.perf_counter() - start
            print(f"  pretrain step {step:5d}/{steps}  loss {loss.item():.3f}  {elapsed:4.0f} s, "
                  f"about {elapsed / step * (steps - step):.0f} s left", flush=True)
    return model


def greedy_completion(predict, prompt: str, shape: tuple[int, int], length: int) -> str:
    """`length` characters after `prompt`, each the most likely next one, from `predict`: a forward
    taking (batch, seq) token ids, compiled for that fixed `shape`. Causal attention makes the
    logits at position n depend only on positions <= n, so the window is filled in place (row 0;
    the prompt keeps its last seq - length characters)."""
    batch, seq = shape
    ids = list(encode(prompt))[-(seq - length):]
    start = len(ids)
    window = np.zeros((batch, seq), np.int64)
    window[0, :start] = ids
    for position in range(start, start + length):
        logits = predict(window)
        window[0, position] = int(np.argmax(logits[0, position - 1]))
    return decode(window[0, start:start + length])
