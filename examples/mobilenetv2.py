"""A small MobileNetV2 (examples/models/cnn.py): a model file for pock-compile.

The task, synthetic so that nothing is downloaded: the orientation of noisy stripes in 32x32
images (horizontal, vertical, diagonal, anti-diagonal). BatchNorm trains in training mode, so
the step also updates its running statistics. PockEngine's MobileNet scheme trains the biases
and the first pointwise conv of the last blocks:

    pock-compile examples/mobilenetv2.py --sparse mobilenet-last-2 --optimizer sgd:lr=0.05,momentum=0.9 -o mbv2_bundle
    python examples/mobilenetv2.py stripes.npz            # the data, in pock-train's layout
    pock-train mbv2_bundle --data stripes.npz --epochs 5
"""

import numpy as np
import torch
import torch.nn as nn
from models.cnn import MobileNetV2Like, Stage

STAGES = (Stage(1, 16, 1, 1), Stage(4, 24, 2, 2), Stage(4, 32, 2, 2), Stage(4, 48, 2, 2))
SIZE = 32
BATCH = 16
LOSS = "cross_entropy"


def model() -> nn.Module:
    torch.manual_seed(0)
    return MobileNetV2Like(width=1.0, num_classes=4, stages=STAGES, stem=16, head=128)


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (samples, 3, SIZE, SIZE) float32 and labels int64: stripes along one of 4 directions."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, samples)
    directions = np.array([(0.0, 1.0), (1.0, 0.0), (1.0, 1.0), (1.0, -1.0)])[labels]
    frequency = rng.uniform(0.3, 0.8, (samples, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, (samples, 1, 1))
    rows, cols = np.meshgrid(np.arange(SIZE), np.arange(SIZE), indexing="ij")
    along = directions[:, 0, None, None] * cols + directions[:, 1, None, None] * rows
    stripes = np.sin(frequency * along + phase)
    images = stripes[:, None] * rng.uniform(0.5, 1.0, (samples, 3, 1, 1)) + rng.normal(0, 0.3, (samples, 3, SIZE, SIZE))
    return images.astype(np.float32), labels.astype(np.int64)


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
