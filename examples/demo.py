"""`make demo`: sparse on-device-style fine-tuning of a CNN, end to end, in a few minutes.

1. Pretrain an MCUNet-style MobileNetV2 in PyTorch on scikit-learn's digits 0-4.
2. Compile a sparse fine-tuning step with pock-mlir (the paper's MobileNet scheme: biases
   everywhere, the first pointwise conv of the last blocks, and the new classifier head).
3. Fine-tune it on digits 5-9 on the IREE runtime, with a progress bar.
4. Print accuracy before/after, time per step against PyTorch eager (full BP and the same
   sparse scheme), and what sparse BP saves over full BP in the backward pass.
"""

import copy
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pock_mlir as pock  # noqa: E402
from examples.quality.vision import BATCH, accuracy, batches, fresh_head, images, pretrain  # noqa: E402

SPARSE = {"preset": "mobilenet-last-3", "classifier.*": "full"}
EPOCHS = 6
SEED = 0


def progress(epoch, done, total, loss, rate):
    bar = "#" * int(30 * done / total)
    print(f"\r  epoch {epoch + 1}/{EPOCHS} [{bar:<30}] {done}/{total} loss {loss:.3f} {rate:.0f} steps/s",
          end="", flush=True)


def torch_step_ms(model, x, y, trainable=None, steps=15):
    model = copy.deepcopy(model)
    for name, p in model.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    xb, yb = torch.from_numpy(x), torch.from_numpy(y)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times[3:]))


def main():
    torch.set_num_threads(2)
    _, (x, y), (x_test, y_test) = images(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "pretrained.pt"
        print("1. pretraining a MobileNetV2-like CNN on digits 0-4 (PyTorch)")
        pretrain(SEED, 8, checkpoint)
        model = fresh_head(checkpoint, SEED)

    print("2. compiling the sparse fine-tuning step with pock-mlir")
    start = time.perf_counter()
    program = pock.compile_training(model, x[:BATCH], y[:BATCH], loss="cross_entropy",
                                    optimizer=pock.SGD(lr=0.05, momentum=0.9), sparse=SPARSE)
    print(f"   compiled in {time.perf_counter() - start:.0f}s; {len(program.signature.trainable)} of "
          f"{len(program.signature.params)} parameter tensors are trained")
    report = program.report()
    trainer = program.trainer()
    before = accuracy(trainer.evaluate, x_test, y_test)

    print(f"3. fine-tuning on digits 5-9 (new classes); test accuracy before: {before:.3f}")
    step_times = []
    for epoch in range(EPOCHS):
        epoch_batches = list(batches(x, y, SEED + epoch))
        for i, (xb, yb) in enumerate(epoch_batches):
            t = time.perf_counter()
            loss = trainer.step(xb, yb)
            step_times.append(time.perf_counter() - t)
            progress(epoch, i + 1, len(epoch_batches), loss, 1 / np.mean(step_times[-10:]))
        print(f"  test accuracy {accuracy(trainer.evaluate, x_test, y_test):.3f}")
    after = accuracy(trainer.evaluate, x_test, y_test)

    pock_ms = 1000 * float(np.median(step_times[5:]))
    trainable = set(program.signature.trainable)
    eager_full = torch_step_ms(model, x[:BATCH], y[:BATCH])
    eager_sparse = torch_step_ms(model, x[:BATCH], y[:BATCH], trainable)
    full, sparse = report.full, report.sparse
    full_bytes = full.saved_activation_bytes + full.gradient_bytes
    sparse_bytes = sparse.saved_activation_bytes + sparse.gradient_bytes
    print("4. results")
    print(f"   test accuracy on digits 5-9: {before:.3f} before -> {after:.3f} after fine-tuning")
    print(f"   ms per step: pock-mlir sparse {pock_ms:.2f} | PyTorch eager full BP {eager_full:.2f} "
          f"({eager_full / pock_ms:.1f}x) | PyTorch eager, same sparse scheme {eager_sparse:.2f} ({eager_sparse / pock_ms:.1f}x)")
    print(f"   backward pass, full BP -> sparse BP: {full.flops / 1e6:.1f} -> {sparse.flops / 1e6:.1f} MFLOP, "
          f"saved activations + gradients {full_bytes / 1024:.0f} -> {sparse_bytes / 1024:.0f} KiB "
          f"({100 * (1 - sparse_bytes / full_bytes):.0f}% less memory)")


if __name__ == "__main__":
    main()
