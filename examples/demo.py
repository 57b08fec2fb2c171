"""`make demo`: fine-tune an MLP on scikit-learn's digits through the whole pock-mlir chain.

PyTorch model -> torch dialect -> pock dialect -> pock passes -> IREE -> iree.runtime, with
PyTorch (torch.optim on the same data order) alongside as the reference loss curve.
"""

import copy
import time

import numpy as np
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

import pock_mlir as pock

BATCH = 64
EPOCHS = 8


def load_data(seed=0):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def batches(x, y, epoch):
    order = np.random.RandomState(epoch).permutation(len(x))
    for start in range(0, len(x) - BATCH + 1, BATCH):
        index = order[start:start + BATCH]
        yield x[index], y[index]


def accuracy(predict, x, y):
    correct = 0
    for start in range(0, len(x) - BATCH + 1, BATCH):
        logits = predict(x[start:start + BATCH])
        correct += int((np.argmax(logits, 1) == y[start:start + BATCH]).sum())
    return correct / (len(x) // BATCH * BATCH)


def main():
    torch.manual_seed(0)
    x_train, y_train, x_val, y_val = load_data()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    reference = copy.deepcopy(model)
    optimizer = pock.SGD(lr=0.1, momentum=0.9)

    start = time.perf_counter()
    program = pock.compile_training(model, x_train[:BATCH], y_train[:BATCH], loss="cross_entropy",
                                    optimizer=optimizer, target="host")
    print(f"compiled the training step in {time.perf_counter() - start:.1f}s "
          f"({len(program.vmfb) / 1024:.0f} KiB IREE module)")
    trainer = program.trainer()
    torch_opt = optimizer.torch_optimizer(reference.parameters())

    print(f"accuracy before fine-tuning: {accuracy(trainer.evaluate, x_val, y_val):.3f}")
    print("epoch  pock loss  torch loss  val acc   ms/step (pock, torch)")
    for epoch in range(EPOCHS):
        pock_losses, torch_losses, pock_time, torch_time = [], [], 0.0, 0.0
        for xb, yb in batches(x_train, y_train, epoch):
            t = time.perf_counter()
            pock_losses.append(trainer.step(xb, yb))
            pock_time += time.perf_counter() - t
            t = time.perf_counter()
            torch_opt.zero_grad()
            loss = nn.functional.cross_entropy(reference(torch.from_numpy(xb)), torch.from_numpy(yb))
            loss.backward()
            torch_opt.step()
            torch_time += time.perf_counter() - t
            torch_losses.append(loss.item())
        steps = len(pock_losses)
        acc = accuracy(trainer.evaluate, x_val, y_val)
        print(f"{epoch + 1:5d}  {np.mean(pock_losses):9.4f}  {np.mean(torch_losses):10.4f}  {acc:7.3f}   "
              f"{1000 * pock_time / steps:.2f}, {1000 * torch_time / steps:.2f}")
    print(f"final validation accuracy: {accuracy(trainer.evaluate, x_val, y_val):.3f}")


if __name__ == "__main__":
    main()
