"""A small BERT-style encoder classifier (examples/models/transformer.py): a model file for pock-compile.

The task, synthetic so that nothing is downloaded: which of the tokens 1, 2 and 3 occurs most
often in a padded sequence of random tokens. Only the last encoder block, the biases, the
normalizations and the classifier train (PockEngine's transformer-last-K scheme):

    pock-compile examples/bert_classifier.py --sparse transformer-last-1 --optimizer adamw:lr=3e-3 -o bert_bundle
    python examples/bert_classifier.py bert.npz          # the data, in pock-train's layout
    pock-train bert_bundle --data bert.npz --epochs 10
"""

import numpy as np
import torch
import torch.nn as nn
from models.transformer import BertConfig, BertLike

CONFIG = BertConfig(vocab=32, max_len=16, dim=32, heads=4, layers=2, hidden=64, classes=3)
CLS = CONFIG.vocab - 1
BATCH = 16
LOSS = "cross_entropy"


def model() -> nn.Module:
    torch.manual_seed(0)
    return BertLike(CONFIG)


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (samples, max_len) int64: a [CLS] token (the classifier reads its position),
    random tokens, padding (0) at the end; the label is whichever of 1, 2, 3 occurs most (ties: the lowest)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, CLS, size=(samples, CONFIG.max_len))
    ids[:, 0] = CLS
    lengths = rng.integers(CONFIG.max_len // 2, CONFIG.max_len + 1, size=samples)
    ids[np.arange(CONFIG.max_len) >= lengths[:, None]] = CONFIG.pad_id
    counts = np.stack([(ids == token).sum(1) for token in (1, 2, 3)], axis=1)
    return ids.astype(np.int64), counts.argmax(1).astype(np.int64)


def load_data() -> dict[str, np.ndarray]:
    x_train, y_train = make_data(1024, seed=0)
    x_val, y_val = make_data(256, seed=1)
    return {"x_train": x_train, "y_train": y_train, "x_val": x_val, "y_val": y_val}


def example_batch():
    x, y = make_data(BATCH, seed=0)
    return torch.from_numpy(x), torch.from_numpy(y)


if __name__ == "__main__":
    from models.data_file import write_data_main  # examples/ is on sys.path when run as a script

    write_data_main(__doc__, load_data)
