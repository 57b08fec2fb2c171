"""Text classification transfer learning: does sparse fine-tuning keep a BERT-like encoder's accuracy?

A character-level BERT-like encoder (the bench's BertLike: 4 post-LayerNorm blocks, a classifier
on the first token, here of width 128) is pretrained in PyTorch to tell which standard-library
source file a window of code comes from, then fine-tuned with pock-mlir to tell which module's
documentation (pydoc's plain text) a window of prose comes from: new classes and a fresh
classifier head, under several update schemes, with PyTorch full fine-tuning as the reference
row. Each module's documentation is dealt out in pieces to training, validation and test text
(70/15/15); each scheme trains at every rate of LEARNING_RATES and keeps the one with the best
accuracy on the validation windows; the test windows are only read to report. Everything comes
from this machine's Python installation; nothing is downloaded. Deterministic for a seed; writes
a JSON result, a Markdown table, a PNG plot of the training loss and one of the test accuracy
against the device memory each scheme trains in.

--search presets adds the schemes pock.search_sparse finds at the device memory each scheme of
SEARCH_AGAINST measured (--search 12,20: under budgets given in MB, as Trainer.device_bytes counts
it), all from one search on the fine-tuning batches and the validation windows, written to
OUT/text_search_<MB>MB.yaml; they then train like the hand-written schemes, each row after the
scheme whose memory it was searched at. The bench's BERT-like "searched" row trains the one found
at the sparse preset's memory (bench/models.py). --quick searches whole tensors only, for 3 steps each.

    python examples/quality/text.py [--quick] [--out examples/quality/results] [--search presets|MB,...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import pock_mlir as pock  # noqa: E402
from bench.models import MODELS  # noqa: E402
from examples.models.char_text import SOURCE_MODULES, VOCAB, documentation, encode, pretrain, source_files  # noqa: E402
from examples.models.transformer import BertConfig, BertLike  # noqa: E402
from examples.quality.cli import (  # noqa: E402
    PRESETS,
    QUICK_SEARCH,
    REFERENCE,
    Searched,
    in_table_order,
    parse,
    samples,
    searched_schemes,
    write_searched,
)
from examples.quality.plots import save_against_memory, save_loss_curves  # noqa: E402
from pock_mlir.files import atomic_write  # noqa: E402

TOPICS = ("pathlib", "datetime", "random", "threading")  # the fine-tuning classes: whose documentation
SEQ, BATCH = 128, 8
CHUNK = 512  # the documentation is dealt out to training, validation and test in pieces of this many characters
CONFIG = BertConfig(vocab=VOCAB, max_len=SEQ, dim=128, heads=4, layers=4, hidden=256, classes=len(TOPICS))
LEARNING_RATES = (3e-4, 1e-3, 3e-3)  # AdamW; each scheme keeps its best on the validation windows
SEARCH_LR = 1e-3  # the candidates' fine-tuning in the search (AdamW)

LORA = "lora:r=8,alpha=16"
HEAD = {"classifier": "full"}  # the fresh head trains in every scheme
# the bench's BERT-like sparse scheme (bench/models.py), with the head: the backward stops at block 2
BENCH_SCHEME = "sparse preset, blocks 2-3 only"
SCHEMES = {
    "full": None,
    "sparse preset (last 2 blocks)": {"preset": "transformer-last-2", **HEAD},
    BENCH_SCHEME: {**MODELS["bert"].sparse, **HEAD},
    "last block only": {"blocks.3": "full", **HEAD, "default": "frozen"},
    "LoRA r=8, attention": {"blocks.*.attention": LORA, **HEAD},
    "LoRA r=8, all linears": {"blocks": LORA, **HEAD},
}
# --quick is a smoke test of the whole path: the bench's scheme and LoRA (and any searched)
QUICK_SCHEMES = (BENCH_SCHEME, "LoRA r=8, attention")
SEARCH_AGAINST = (
    "sparse preset (last 2 blocks)",
    BENCH_SCHEME,
    "last block only",
    "LoRA r=8, attention",
    "LoRA r=8, all linears",
)  # --search presets


def labelled_windows(texts: list[np.ndarray], count: int, rng: np.random.RandomState):
    """`count` windows of SEQ characters at random offsets, as many of each class as `count` allows
    (the class of a window is the index of its text), shuffled."""
    labels = np.arange(count) % len(texts)
    rng.shuffle(labels)
    starts = [rng.randint(0, len(texts[label]) - SEQ) for label in labels]
    return np.stack([texts[label][s : s + SEQ] for label, s in zip(labels, starts)]), labels.astype(np.int64)


def deal(tokens: np.ndarray) -> list[np.ndarray]:
    """Training, validation and test text of one topic: its CHUNK-character pieces dealt out 14/3/3
    in turn, so that the three sample every part of the documentation alike."""
    pieces = [tokens[i : i + CHUNK] for i in range(0, len(tokens), CHUNK)]
    return [
        np.concatenate([piece for i, piece in enumerate(pieces) if lo <= i % 20 < hi])
        for lo, hi in ((0, 14), (14, 17), (17, 20))
    ]


def splits(seed: int, finetune_steps: int, held_out: int) -> dict:
    """The fine-tuning batches and the validation and test windows, each from its own share of
    every topic's documentation (deal)."""
    parts = [deal(encode(text)) for text in documentation(TOPICS)]
    rng = np.random.RandomState(seed + 1)
    return {
        "train": [labelled_windows([p[0] for p in parts], BATCH, rng) for _ in range(finetune_steps)],
        "val": labelled_windows([p[1] for p in parts], held_out, np.random.RandomState(seed + 2)),
        "test": labelled_windows([p[2] for p in parts], 2 * held_out, np.random.RandomState(seed + 3)),
    }


def pretrain_on_source(seed: int, steps: int) -> BertLike:
    """A BertLike taught by `steps` PyTorch AdamW updates which source file a window comes from."""
    sources = [encode(text) for text in source_files()]
    torch.manual_seed(seed)
    model = BertLike(dataclasses.replace(CONFIG, classes=len(SOURCE_MODULES)))
    return pretrain(model, lambda rng: labelled_windows(sources, BATCH, rng), F.cross_entropy, steps, seed, lr=1e-3)


def fresh_head(pretrained: BertLike, seed: int) -> BertLike:
    """The pretrained encoder under a new classifier for TOPICS."""
    torch.manual_seed(seed + 100)
    model = BertLike(CONFIG)
    model.load_state_dict(
        {k: v for k, v in pretrained.state_dict().items() if not k.startswith("classifier.")}, strict=False
    )
    return model


def accuracy(predict, windows) -> float:
    """Over batches of BATCH (the compiled forward takes exactly that many)."""
    x, y = windows
    correct = sum(
        int((np.argmax(predict(x[i : i + BATCH]), 1) == y[i : i + BATCH]).sum())
        for i in range(0, len(x) - BATCH + 1, BATCH)
    )
    return correct / (len(x) // BATCH * BATCH)


def torch_finetune(base, data, lr) -> dict:
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, step_times = [], []
    for x, y in data["train"]:
        t = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t)
        losses.append(loss.item())
    with torch.no_grad():
        predict = lambda x: model(torch.from_numpy(x)).numpy()  # noqa: E731
        accuracies = {"val_accuracy": accuracy(predict, data["val"]), "test_accuracy": accuracy(predict, data["test"])}
    return {
        "lr": lr,
        "train_loss": losses,
        **accuracies,
        "step_ms": 1000 * float(np.median(step_times[2:])),
        "trainable": sum(p.numel() for p in model.parameters()),
    }


def pock_finetune(base, scheme, data, lr) -> dict:
    x0, y0 = data["train"][0]
    start = time.perf_counter()
    program = pock.compile_training(
        copy.deepcopy(base), x0, y0, loss="cross_entropy", optimizer=pock.AdamW(lr=lr, weight_decay=0.0), sparse=scheme
    )
    compile_s = time.perf_counter() - start
    trainer = program.trainer()
    losses, step_times = [], []
    for x, y in data["train"]:
        t = time.perf_counter()
        losses.append(trainer.step(x, y))
        step_times.append(time.perf_counter() - t)
    return {
        "lr": lr,
        "train_loss": losses,
        "val_accuracy": accuracy(trainer.evaluate, data["val"]),
        "test_accuracy": accuracy(trainer.evaluate, data["test"]),
        "step_ms": 1000 * float(np.median(step_times[2:])),
        "compile_s": compile_s,
        "trainable": program.signature.trained_values,
        "device_mb": trainer.device_bytes / 2**20,
    }


def search(base, data, searched: list[Searched], seed: int, quick: bool) -> None:
    """Write the scheme pock.search_sparse finds under each budget (see the module docstring)."""
    results = pock.search_sparse(
        copy.deepcopy(base),
        samples(data["train"]),
        data["val"],
        loss="cross_entropy",
        optimizer=pock.AdamW(lr=SEARCH_LR, weight_decay=0.0),
        budget=[pock.Budget(memory_mb=s.mb) for s in searched],
        batch_size=BATCH,
        seed=seed,
        progress=True,
        **(QUICK_SEARCH if quick else {}),
    )
    write_searched(searched, results)


def markdown_report(results: dict) -> str:
    full = results[REFERENCE]["test_accuracy"]
    rows = [
        "| scheme | system | lr (best on val) | test accuracy | vs PyTorch full (points) | ms/step | trained values "
        "| device MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        system = "PyTorch eager" if name == REFERENCE else "pock-mlir"
        memory = f"{r['device_mb']:.2f}" if "device_mb" in r else ""
        rows.append(
            f"| {name} | {system} | {r['lr']:g} | {r['test_accuracy']:.3f} | "
            f"{100 * (r['test_accuracy'] - full):+.1f} | {r['step_ms']:.2f} | {r['trainable']:,} | {memory} |"
        )
    return "\n".join(rows)


def plot(results: dict, out: Path) -> None:
    save_loss_curves(
        {
            f"{name}, lr {r['lr']:g} (acc {r['test_accuracy']:.3f})": np.convolve(
                r["train_loss"], np.ones(10) / 10, mode="valid"
            )
            for name, r in results.items()
        },
        "training loss (10-step mean)",
        "Fine-tuning a char-level BERT-like encoder to tell modules' documentation apart",
        out / "text.png",
    )
    save_against_memory(
        {name: (r["device_mb"], r["test_accuracy"]) for name, r in results.items() if "device_mb" in r},
        "test accuracy",
        "Text classification: test accuracy against training memory",
        out / "text_memory.png",
    )


def main(argv=None):
    args, budgets, out = parse(argparse.ArgumentParser(description=__doc__.splitlines()[0]), argv)

    pretrain_steps, finetune_steps, held_out = (40, 10, 64) if args.quick else (1200, 300, 512)
    learning_rates = LEARNING_RATES[1:2] if args.quick else LEARNING_RATES
    print(f"pretraining on windows of {len(SOURCE_MODULES)} stdlib source files", flush=True)
    base = fresh_head(pretrain_on_source(args.seed, pretrain_steps), args.seed)
    data = splits(args.seed, finetune_steps, held_out)

    results, sweeps = {}, {}

    def sweep(schemes: dict) -> None:
        """Each scheme at every learning rate; results keeps the best on the validation windows."""
        for name, scheme in schemes.items():
            sweeps[name] = []
            for lr in learning_rates:
                r = torch_finetune(base, data, lr) if scheme == "torch" else pock_finetune(base, scheme, data, lr)
                sweeps[name].append({k: r[k] for k in ("lr", "val_accuracy", "test_accuracy")})
                print(
                    f"{name}, lr {lr:g}: val accuracy {r['val_accuracy']:.3f}, test accuracy {r['test_accuracy']:.3f}, "
                    f"{r['step_ms']:.2f} ms/step",
                    flush=True,
                )
                if name not in results or r["val_accuracy"] > results[name]["val_accuracy"]:
                    results[name] = r

    hand_written = {n: s for n, s in SCHEMES.items() if not args.quick or n in QUICK_SCHEMES}
    sweep({REFERENCE: "torch", **hand_written})
    at = (
        {results[n]["device_mb"]: n for n in SEARCH_AGAINST if n in results}
        if budgets == PRESETS
        else dict.fromkeys(budgets)
    )
    searched = searched_schemes(out, "text", at)
    if searched:
        search(base, data, searched, args.seed, args.quick)
        sweep({s.name: s.file for s in searched})
    results = in_table_order(results, searched)

    report = markdown_report(results)
    print(report)
    atomic_write(
        out / "text.json",
        json.dumps(
            {
                "seed": args.seed,
                "config": dataclasses.asdict(CONFIG),
                "topics": TOPICS,
                "pretrain_steps": pretrain_steps,
                "finetune_steps": finetune_steps,
                "results": results,
                "sweeps": sweeps,
            },
            indent=1,
        ),
    )
    atomic_write(out / "text.md", report + "\n")
    plot(results, out)


if __name__ == "__main__":
    main()
