"""A tiny LLaMA-style decoder (examples/models/transformer.py): a model file for pock-compile.

The task, synthetic so that nothing is downloaded: continue arithmetic sequences modulo the
vocabulary (start a, stride b: a, a+b, a+2b, ...), next-token prediction at every position.
The token embedding is tied to the output projection; the exported state_dict has both names.

    pock-compile examples/tiny_llama.py --sparse transformer-last-1 --optimizer adamw:lr=3e-3 -o llama_bundle
    python examples/tiny_llama.py llama.npz              # the data, in pock-train's layout
    pock-train llama_bundle --data llama.npz --epochs 10
"""

import numpy as np
import torch
import torch.nn as nn
from models.transformer import LlamaConfig, LlamaLike, token_cross_entropy

CONFIG = LlamaConfig(vocab=32, max_len=16, dim=32, heads=4, kv_heads=2, layers=2, hidden=64)
BATCH = 8
LOSS = token_cross_entropy


def model() -> nn.Module:
    torch.manual_seed(0)
    return LlamaLike(CONFIG)


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (samples, max_len) and targets (the same sequences one step on), int64 token ids."""
    rng = np.random.default_rng(seed)
    start, stride = rng.integers(0, CONFIG.vocab, (samples, 1)), rng.integers(1, 4, (samples, 1))
    tokens = (start + stride * np.arange(CONFIG.max_len + 1)) % CONFIG.vocab
    return tokens[:, :-1].astype(np.int64), tokens[:, 1:].astype(np.int64)


def load_data() -> dict[str, np.ndarray]:
    x_train, y_train = make_data(512, seed=0)
    x_val, y_val = make_data(128, seed=1)
    return {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val}


def example_batch():
    x, y = make_data(BATCH, seed=0)
    return torch.from_numpy(x), torch.from_numpy(y)


if __name__ == "__main__":
    from models.data_file import write_data_main  # examples/ is on sys.path when run as a script

    write_data_main(__doc__, load_data)
