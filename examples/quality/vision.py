"""Vision transfer learning: sparse fine-tuning against full fine-tuning, on real images.

An MCUNet-style MobileNetV2 is pretrained in PyTorch on scikit-learn's digits 0-4, then
fine-tuned with pock-mlir on digits 5-9 (new classes, a fresh classifier head) under several
update schemes, with PyTorch full fine-tuning as the reference row. BatchNorm runs in eval
mode (frozen statistics), the usual choice when fine-tuning. Schemes differ in how large a
learning rate they tolerate (full fine-tuning diverges where bias-only is still slow), so each
scheme trains at every rate of LEARNING_RATES and keeps the one with the best accuracy on a
validation split carved from the fine-tuning training data; the test split is only read to
report. Each run is its own process, so its memory is its own: "training MB" is the growth of
the resident set while training (parameters on the device, gradients, optimizer state,
activations), measured from just before the first step. Deterministic for a seed; writes a
JSON result, a Markdown table and a PNG plot.

--search presets adds the schemes pock.search_sparse finds at the device memory each scheme of
SEARCH_AGAINST measured (--search 4,8: under budgets given in MB, as Trainer.device_bytes counts
it), all from one search on the fine-tuning training and validation splits, written to
OUT/vision_search_<MB>MB.yaml; they then train like the hand-written schemes, each row after the
scheme whose memory it was searched at. --quick, a smoke test, pretrains a smaller network (one
block per stage) for 2 epochs, fine-tunes for 1 at one learning rate, and searches whole tensors
only, for 3 steps each.

    python examples/quality/vision.py [--quick] [--out examples/quality/results] [--search presets|MB,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import astuple
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.memory import reset_peak, rss_kb  # noqa: E402
from examples.models.cnn import MobileNetV2Like, Stage  # noqa: E402
from examples.quality.cli import (  # noqa: E402
    PRESETS,
    QUICK_SEARCH,
    REFERENCE,
    Searched,
    in_table_order,
    parse,
    searched_schemes,
    write_searched,
)
from examples.quality.plots import save_against_memory, save_loss_curves  # noqa: E402
from pock_mlir.files import atomic_write  # noqa: E402

BATCH = 32
SIZE = 32
STAGES = (Stage(1, 16, 1, 1), Stage(4, 24, 2, 2), Stage(4, 32, 2, 2), Stage(4, 64, 2, 2))
# --quick, a smoke test of the path: one block per stage, fewer distinct layers to compile
QUICK_STAGES = (Stage(1, 16, 1, 1), Stage(4, 24, 1, 2), Stage(4, 32, 1, 2), Stage(4, 64, 1, 2))
LEARNING_RATES = (0.003, 0.01, 0.03, 0.1)  # SGD with momentum 0.9; each scheme keeps its best
SEARCH_LR = 0.03  # the candidates' fine-tuning in the search (SGD with momentum 0.9)

SCHEMES = {
    "full": None,
    "bias only": {"preset": "bias-only", "classifier.*": "full"},
    "last 2 blocks": {
        "features.6.*": "full",
        "features.7.*": "full",
        "features.8.*": "full",
        "classifier.*": "full",
        "default": "frozen",
    },
    "sparse preset": "mobilenet-last-3",
    "channel-sparse (50%)": {
        "features.*.conv.0.0": 0.5,
        "features.*.conv.2": 0.5,
        "*bias": "full",
        "classifier.*": "full",
        "default": "frozen",
    },
}
# --quick is a smoke test of the whole path: a preset and a channel-sparse scheme (and any searched)
QUICK_SCHEMES = ("sparse preset", "channel-sparse (50%)")
SEARCH_AGAINST = ("bias only", "last 2 blocks", "sparse preset", "channel-sparse (50%)")  # --search presets


def search(path: Path, seed: int, searched: list[Searched], quick: bool) -> None:
    """Write the scheme pock.search_sparse finds under each budget (see the module docstring)."""
    import pock_mlir as pock

    data = images(seed)
    results = pock.search_sparse(
        fresh_head(path, seed),
        data["train"],
        data["val"],
        loss="cross_entropy",
        optimizer=pock.SGD(lr=SEARCH_LR, momentum=0.9),
        budget=[pock.Budget(memory_mb=s.mb) for s in searched],
        batch_size=BATCH,
        seed=seed,
        progress=True,
        **(QUICK_SEARCH if quick else {}),
    )
    write_searched(searched, results)


def images(seed: int):
    """Digits as 3x32x32 images: {"pretrain": digits 0-4, "train" / "val" / "test": digits 5-9}."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32))[:, None]
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    x = ((x - 0.3) / 0.4).numpy()
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    old, new = y < 5, y >= 5
    x_new, y_new = x[new], y[new] - 5
    train, val = int(0.56 * len(x_new)), int(0.7 * len(x_new))
    return {
        "pretrain": (x[old], y[old]),
        "train": (x_new[:train], y_new[:train]),
        "val": (x_new[train:val], y_new[train:val]),
        "test": (x_new[val:], y_new[val:]),
    }


def batches(x, y, seed):
    order = np.random.RandomState(seed).permutation(len(x))
    for start in range(0, len(x) - BATCH + 1, BATCH):
        index = order[start : start + BATCH]
        yield x[index], y[index]


def accuracy(predict, x, y) -> float:
    """Over the full batches (the compiled model takes batches of exactly BATCH)."""
    correct, seen = 0, 0
    for start in range(0, len(x) - BATCH + 1, BATCH):
        correct += int((np.argmax(predict(x[start : start + BATCH]), 1) == y[start : start + BATCH]).sum())
        seen += BATCH
    return correct / seen


def network(stages) -> nn.Module:
    return MobileNetV2Like(width=1.0, num_classes=5, stages=stages, stem=16, head=128)


def pretrain(seed: int, epochs: int, path: Path, quick: bool = False):
    """Pretrain the network (QUICK_STAGES' for a --quick run) and save it to `path` with its stages,
    which fresh_head reads."""
    stages = QUICK_STAGES if quick else STAGES
    x, y = images(seed)["pretrain"]
    torch.manual_seed(seed)
    model = network(stages)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(epochs):
        model.train()
        for xb, yb in batches(x, y, seed + epoch):
            opt.zero_grad()
            F.cross_entropy(model(torch.from_numpy(xb)), torch.from_numpy(yb)).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = accuracy(lambda xb: model(torch.from_numpy(xb)).numpy(), x, y)
    print(f"pretrained on digits 0-4: train accuracy {acc:.3f}", flush=True)
    torch.save({"stages": [astuple(stage) for stage in stages], "state": model.state_dict()}, path)


def fresh_head(path: Path, seed: int) -> nn.Module:
    saved = torch.load(path)
    model = network(tuple(Stage(*stage) for stage in saved["stages"]))
    model.load_state_dict(saved["state"])
    torch.manual_seed(seed + 100)
    model.classifier[-1].reset_parameters()  # new classes: a fresh head
    return model.eval()


def run_scheme(name: str, scheme, lr: float, path: Path, seed: int, epochs: int) -> dict:
    data = images(seed)
    (x, y), (x_val, y_val), (x_test, y_test) = data["train"], data["val"], data["test"]
    model = fresh_head(path, seed)
    step_times, losses = [], []
    if name == REFERENCE:
        before = reset_peak()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        for epoch in range(epochs):
            for xb, yb in batches(x, y, seed + epoch):
                t = time.perf_counter()
                opt.zero_grad()
                loss = F.cross_entropy(model(torch.from_numpy(xb)), torch.from_numpy(yb))
                loss.backward()
                opt.step()
                step_times.append(time.perf_counter() - t)
                losses.append(loss.item())
        with torch.no_grad():
            predict = lambda xb: model(torch.from_numpy(xb)).numpy()  # noqa: E731
            val_acc, test_acc = accuracy(predict, x_val, y_val), accuracy(predict, x_test, y_test)
        compile_s, device_mb = 0.0, None
    else:
        import pock_mlir as pock

        start = time.perf_counter()
        program = pock.compile_training(
            model, x[:BATCH], y[:BATCH], loss="cross_entropy", optimizer=pock.SGD(lr=lr, momentum=0.9), sparse=scheme
        )
        compile_s = time.perf_counter() - start
        before = reset_peak()
        trainer = program.trainer()
        for epoch in range(epochs):
            for xb, yb in batches(x, y, seed + epoch):
                t = time.perf_counter()
                losses.append(trainer.step(xb, yb))
                step_times.append(time.perf_counter() - t)
        val_acc, test_acc = accuracy(trainer.evaluate, x_val, y_val), accuracy(trainer.evaluate, x_test, y_test)
        device_mb = trainer.device_bytes / 2**20  # what a search budget counts
    return {
        "device_mb": device_mb,
        "lr": lr,
        "val_accuracy": val_acc,
        "accuracy": test_acc,
        "step_ms": 1000 * float(np.median(step_times[3:])),
        "loss": losses,
        "training_mb": (rss_kb("VmHWM") - before) / 1024,
        "compile_s": compile_s,
    }


def plot(results: dict, path: Path):
    save_loss_curves(
        {
            f"{name}, lr {r['lr']:g} (acc {r['accuracy']:.3f})": np.convolve(r["loss"], np.ones(5) / 5, mode="valid")
            for name, r in results.items()
        },
        "training loss (5-step mean)",
        "Fine-tuning a MobileNetV2-like CNN from digits 0-4 to digits 5-9",
        path,
    )


def markdown_table(results: dict) -> str:
    ref = results[REFERENCE]
    rows = [
        "| scheme | system | lr (best on val) | test accuracy | vs PyTorch full (points) | ms/step | "
        "speed vs PyTorch full | training MB | device MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        system = "PyTorch eager" if name == REFERENCE else "pock-mlir"
        device = f"{r['device_mb']:.2f}" if r["device_mb"] else ""
        rows.append(
            f"| {name} | {system} | {r['lr']:g} | {r['accuracy']:.3f} | "
            f"{100 * (r['accuracy'] - ref['accuracy']):+.1f} | {r['step_ms']:.2f} | "
            f"{ref['step_ms'] / r['step_ms']:.2f}x | {r['training_mb']:.0f} | {device} |"
        )
    return "\n".join(rows)


def run_in_child(name: str, lr: float, args, scheme_file: str | None) -> dict:
    command = [sys.executable, __file__, "--scheme", name, "--lr", str(lr), "--out", args.out, "--seed", str(args.seed)]
    command += ["--quick"] if args.quick else []
    command += ["--scheme-file", scheme_file] if scheme_file else []
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"scheme {name!r} at lr {lr} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sweep(names, learning_rates, args, results: dict, sweeps: dict, files: dict) -> None:
    """Each scheme at every learning rate, each run in its own process; results keeps the best on val."""
    for name in names:
        sweeps[name] = []
        for lr in learning_rates:
            r = run_in_child(name, lr, args, files.get(name))
            sweeps[name].append({k: r[k] for k in ("lr", "val_accuracy", "accuracy")})
            print(
                f"{name}, lr {lr:g}: val accuracy {r['val_accuracy']:.3f}, test accuracy {r['accuracy']:.3f}, "
                f"{r['step_ms']:.2f} ms/step, training {r['training_mb']:.0f} MB",
                flush=True,
            )
            if name not in results or r["val_accuracy"] > results[name]["val_accuracy"]:
                results[name] = r


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", help=argparse.SUPPRESS)  # internal: one run in this process
    parser.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--scheme-file", help=argparse.SUPPRESS)  # internal: a searched scheme's
    args, budgets, out = parse(parser, argv)
    args.out = str(out)
    pretrain_epochs, finetune_epochs = (2, 1) if args.quick else (12, 10)
    learning_rates = LEARNING_RATES[1:2] if args.quick else LEARNING_RATES
    checkpoint = out / "vision_pretrained.pt"

    if args.scheme:
        scheme = args.scheme_file or SCHEMES.get(args.scheme)  # None: full, or the reference
        print(json.dumps(run_scheme(args.scheme, scheme, args.lr, checkpoint, args.seed, finetune_epochs)))
        return
    pretrain(args.seed, pretrain_epochs, checkpoint, args.quick)
    results, sweeps = {}, {}
    sweep(
        [REFERENCE, *(n for n in SCHEMES if not args.quick or n in QUICK_SCHEMES)],
        learning_rates,
        args,
        results,
        sweeps,
        {},
    )
    at = (
        {results[n]["device_mb"]: n for n in SEARCH_AGAINST if n in results}
        if budgets == PRESETS
        else dict.fromkeys(budgets)
    )
    searched = searched_schemes(out, "vision", at)
    if searched:
        search(checkpoint, args.seed, searched, args.quick)
        sweep([s.name for s in searched], learning_rates, args, results, sweeps, {s.name: s.file for s in searched})
    results = in_table_order(results, searched)
    table = markdown_table(results)
    print(table)
    atomic_write(
        out / "vision.json",
        json.dumps(
            {
                "results": results,
                "sweeps": sweeps,
                "seed": args.seed,
                "pretrain_epochs": pretrain_epochs,
                "finetune_epochs": finetune_epochs,
            },
            indent=1,
        ),
    )
    atomic_write(out / "vision.md", table + "\n")
    plot(results, out / "vision.png")
    save_against_memory(
        {name: (r["device_mb"], r["accuracy"]) for name, r in results.items() if r["device_mb"]},
        "test accuracy",
        "Vision fine-tuning: accuracy against training memory",
        out / "vision_memory.png",
    )
    checkpoint.unlink()


if __name__ == "__main__":
    main()
