"""`make demo`: sparse on-device-style fine-tuning of a CNN, end to end, in a few minutes.

1. Pretrain an MCUNet-style MobileNetV2 in PyTorch on scikit-learn's digits 0-4.
2. Compile a sparse fine-tuning step with pock-mlir (the paper's MobileNet scheme: biases
   everywhere, the first pointwise conv of the last blocks, and the new classifier head).
3. Fine-tune it on digits 5-9 on the IREE runtime, with a progress bar.
4. Print accuracy before/after, time per step against PyTorch eager (full BP and the same
   sparse scheme), and what sparse BP saves over full BP in the backward pass.

The step times come from rounds in which the three systems take turns on one fixed batch (each
round after one untimed step), so that other jobs on the machine slow them alike; the ratios
still depend on the load, which the demo prints. bench/ measures them carefully.
"""

import argparse
import copy
import os
import statistics
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
LR = 0.05


def progress(epoch, epochs, done, total, loss, rate, left_s):
    """A progress bar redrawn in place on a terminal; in a log, one line at each epoch's end."""
    if sys.stdout.isatty() or done == total:
        bar = "#" * int(30 * done / total)
        print(
            f"\r  epoch {epoch + 1}/{epochs} [{bar:<30}] {done}/{total} loss {loss:.3f} "
            f"{rate:.0f} steps/s, {left_s:.0f}s left ",
            end="",
            flush=True,
        )


def torch_step(model, x, y, trainable=None):
    """One SGD-momentum step of PyTorch eager on (x, y), as a function; `trainable` freezes the rest."""
    model = copy.deepcopy(model)
    for name, p in model.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
    xb, yb = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def interleaved_ms(systems: dict, rounds: int, steps: int) -> dict:
    """Median ms per step of each system: they take turns, round by round (each round after one
    untimed step); per system the round with the lowest median counts."""
    medians = {name: [] for name in systems}
    for _ in range(rounds):
        for name, step in systems.items():
            step()
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            medians[name].append(1000 * statistics.median(times))
    return {name: min(values) for name, values in medians.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--epochs", type=int, default=6, help="fine-tuning epochs (default 6)")
    parser.add_argument("--pretrain-epochs", type=int, default=8, help="PyTorch pretraining epochs (default 8)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved timing rounds of 10 steps per system (default 5)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("epochs", "pretrain_epochs", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    torch.set_num_threads(2)
    data = images(args.seed)
    (x, y), (x_test, y_test) = data["train"], data["test"]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "pretrained.pt"
        print("1. pretraining a MobileNetV2-like CNN on digits 0-4 (PyTorch)", flush=True)
        pretrain(args.seed, args.pretrain_epochs, checkpoint)
        model = fresh_head(checkpoint, args.seed)

    print("2. compiling the sparse fine-tuning step with pock-mlir", flush=True)
    start = time.perf_counter()
    program = pock.compile_training(
        model,
        x[:BATCH],
        y[:BATCH],
        loss="cross_entropy",
        optimizer=pock.SGD(lr=LR, momentum=0.9),
        sparse=SPARSE,
        verbose=True,
    )
    print(
        f"   compiled in {time.perf_counter() - start:.0f}s; {len(program.signature.trainable)} of "
        f"{len(program.signature.params)} parameter tensors are trained"
    )
    report = program.report()
    trainer = program.trainer()
    before = accuracy(trainer.evaluate, x_test, y_test)

    print(f"3. fine-tuning on digits 5-9 (new classes); test accuracy before: {before:.3f}")
    steps_per_epoch = len(x) // BATCH
    total_steps, step_times = args.epochs * steps_per_epoch, []
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(batches(x, y, args.seed + epoch)):
            t = time.perf_counter()
            loss = trainer.step(xb, yb)
            step_times.append(time.perf_counter() - t)
            recent = float(np.mean(step_times[-10:]))
            progress(
                epoch, args.epochs, i + 1, steps_per_epoch, loss, 1 / recent, recent * (total_steps - len(step_times))
            )
        print(f"test accuracy {accuracy(trainer.evaluate, x_test, y_test):.3f}")
    after = accuracy(trainer.evaluate, x_test, y_test)

    print("4. results")
    print(f"   test accuracy on digits 5-9: {before:.3f} before -> {after:.3f} after fine-tuning")
    load_before = os.getloadavg()[0]
    xb, yb = x[:BATCH], y[:BATCH]
    ms = interleaved_ms(
        {
            "pock": lambda: trainer.step(xb, yb),
            "eager full": torch_step(model, xb, yb),
            "eager sparse": torch_step(model, xb, yb, set(program.signature.trainable)),
        },
        args.rounds,
        steps=10,
    )
    pock_ms = ms["pock"]
    print(
        f"   ms per step (batch {BATCH}, interleaved rounds; machine load {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after): pock-mlir sparse {pock_ms:.2f} | PyTorch eager full BP "
        f"{ms['eager full']:.2f} ({ms['eager full'] / pock_ms:.1f}x) | PyTorch eager, same sparse scheme "
        f"{ms['eager sparse']:.2f} ({ms['eager sparse'] / pock_ms:.1f}x)"
    )
    print(
        "   (ratios move with the machine's load: PyTorch's threads suffer most when other jobs run;"
        " see bench/results.md for careful measurements)"
    )
    full, sparse = report.full, report.sparse
    full_bytes = full.saved_activation_bytes + full.gradient_bytes
    sparse_bytes = sparse.saved_activation_bytes + sparse.gradient_bytes
    print(
        f"   backward pass, full BP -> sparse BP: {full.flops / 1e6:.1f} -> {sparse.flops / 1e6:.1f} MFLOP, "
        f"saved activations + gradients {full_bytes / 1024:.0f} -> {sparse_bytes / 1024:.0f} KiB "
        f"({100 * (1 - sparse_bytes / full_bytes):.0f}% less memory)"
    )


if __name__ == "__main__":
    main()
