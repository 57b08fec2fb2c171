"""An MLP on scikit-learn's 8x8 digits: a model file for pock-compile.

    pock-compile examples/mlp_digits.py --optimizer sgd:lr=0.1,momentum=0.9 -o digits_bundle
    python examples/mlp_digits.py digits.npz        # the data, in pock-train's layout
    pock-train digits_bundle --data digits.npz --epochs 5 --checkpoint digits.ckpt

A model file defines model(), example_batch() and optionally LOSS (see pock-compile --help).
"""

import numpy as np
import torch
import torch.nn as nn

BATCH = 64
LOSS = "cross_entropy"


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def load_data(seed: int = 0) -> dict[str, np.ndarray]:
    """Digits as pock-train reads them: x_* float32 (N, 64) in [0, 1], y_* int64 labels; 80/20 split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.RandomState(seed).permutation(len(digits.data))
    x, y = (digits.data[order] / 16.0).astype(np.float32), digits.target[order].astype(np.int64)
    split = int(0.8 * len(x))
    return {"x_train": x[:split], "y_train": y[:split], "x_val": x[split:], "y_val": y[split:]}


def example_batch():
    data = load_data()
    return torch.from_numpy(data["x_train"][:BATCH]), torch.from_numpy(data["y_train"][:BATCH])


if __name__ == "__main__":
    from models.data_file import write_data_main  # examples/ is on sys.path when run as a script

    write_data_main(__doc__, load_data)
