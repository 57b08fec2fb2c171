"""Language transfer learning: does sparse fine-tuning keep full fine-tuning's quality?

A character-level LLaMA-like decoder is pretrained in PyTorch on Python standard-library
source code, then fine-tuned with pock-mlir on a different corpus, the standard library's
documentation prose (pydoc text), under several update schemes, with PyTorch full
fine-tuning as the reference row. Each scheme trains at every rate of LEARNING_RATES and keeps
the one with the lowest loss on a validation split of the documentation; the reported loss is
on a separate test split. Everything comes from this machine's Python installation; nothing is
downloaded. Seeded (data, splits, initialisations); writes a JSON result, a PNG plot of the training
loss and one of the test loss against the device memory each scheme trains in.

--search presets adds the schemes pock.search_sparse finds at the device memory each scheme of
SEARCH_AGAINST measured (--search 12,20: under budgets given in MB, as Trainer.device_bytes counts
it), all from one search on the fine-tuning batches and the validation split (and one over the int8
base, at the memory of the schemes over it), written to OUT/language_search_<MB>MB[_int8].yaml;
they then train like the hand-written schemes, each row after the scheme whose memory it was
searched at. --quick searches whole tensors only, for 3 steps each.

--bases trains only BASES_SCHEMES, the sparse preset and LoRA over a float32 and an int4 frozen base
(with the PyTorch reference), and writes them to OUT/language_bases.{json,md,png} apart from the
full table: the comparison of frozen bases in a fraction of the full run's time.

    python examples/quality/language.py [--quick] [--out examples/quality/results] [--search presets|MB,...]
    python examples/quality/language.py --bases
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import pock_mlir as pock  # noqa: E402
from examples.models.char_text import (  # noqa: E402
    VOCAB,
    documentation_corpus,
    encode,
    greedy_completion,
    pretrain,
    source_corpus,
    windows,
)
from examples.models.transformer import LlamaConfig, LlamaLike, token_cross_entropy  # noqa: E402
from examples.quality.cli import (  # noqa: E402
    PRESETS,
    QUICK_SEARCH,
    REFERENCE,
    Searched,
    in_table_order,
    parse,
    samples,
    searched_schemes,
    searches,
    write_searched,
)
from examples.quality.plots import save_against_memory, save_loss_curves  # noqa: E402
from pock_mlir.files import atomic_write  # noqa: E402


def fixed_batches(tokens, seq, batch, count, seed):
    rng = np.random.RandomState(seed)
    return [windows(tokens, seq, batch, rng) for _ in range(count)]


def torch_loss(model, x, y) -> float:
    with torch.no_grad():
        return token_cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).item()


LEARNING_RATES = (1e-3, 3e-3, 1e-2)  # AdamW; each scheme keeps its best on the validation split
SEARCH_LR = 3e-3  # the candidates' fine-tuning in the search (AdamW)

LORA = "lora:r=8,alpha=16"
INT8 = {"quantize": {"frozen": "int8"}}  # frozen linear weights stored as int8 (pock_mlir/quantize.py)
INT4 = {"quantize": {"frozen": "int4"}}  # and the tied embedding too, as int4 in groups of 32
SCHEMES = {
    "full": None,
    "sparse preset (last 2 blocks)": "transformer-last-2",
    "last block only": {"blocks.3.*": "full", "norm.*": "full", "default": "frozen"},
    "norms only": {"*norm*": "full", "default": "frozen"},
    # PockEngine's comparison with LoRA (its Table 4), each also over an int8 and an int4 frozen base
    "LoRA r=8, attention": {"blocks.*.attention": LORA},
    "LoRA r=8, all linears": {"blocks": LORA},
    "sparse preset, int8 base": {"preset": "transformer-last-2", **INT8},
    "LoRA r=8, attention, int8 base": {"blocks.*.attention": LORA, **INT8},
    "LoRA r=8, all linears, int8 base": {"blocks": LORA, **INT8},
    "sparse preset, int4 base": {"preset": "transformer-last-2", **INT4},
    "LoRA r=8, attention, int4 base": {"blocks.*.attention": LORA, **INT4},
    "LoRA r=8, all linears, int4 base": {"blocks": LORA, **INT4},
}
# --quick is a smoke test of the whole path: the preset and LoRA over an int8 base (and any searched)
QUICK_SCHEMES = ("sparse preset (last 2 blocks)", "LoRA r=8, all linears, int8 base")
# --bases: the float32 and int4 bases under the sparse preset and LoRA
BASES_SCHEMES = (
    "sparse preset (last 2 blocks)",
    "sparse preset, int4 base",
    "LoRA r=8, all linears",
    "LoRA r=8, all linears, int4 base",
)
QUICK_BASES = BASES_SCHEMES[:2]  # --quick --bases: the preset over each base
SEARCH_AGAINST = (
    "sparse preset (last 2 blocks)",
    "last block only",
    "norms only",
    "LoRA r=8, attention",
    "LoRA r=8, all linears",
    "sparse preset, int8 base",
)  # --search presets; over int8 where they are


def search(base, train_batches, val_batches, searched: list[Searched], seed: int, quick: bool) -> None:
    """Write the scheme pock.search_sparse finds under each budget (see the module docstring):
    one search over the float32 base, one over the int8 base."""
    for quantize, group in searches(searched).items():
        results = pock.search_sparse(
            copy.deepcopy(base),
            samples(train_batches),
            samples(val_batches),
            loss=token_cross_entropy,
            optimizer=pock.AdamW(lr=SEARCH_LR, weight_decay=0.0),
            budget=[pock.Budget(memory_mb=s.mb) for s in group],
            quantize=quantize,
            batch_size=len(train_batches[0][0]),
            seed=seed,
            progress=True,
            **(QUICK_SEARCH if quick else {}),
        )
        write_searched(group, results)


def held_out_losses(model, splits: dict) -> dict:
    """Mean loss of `model` on each named list of batches."""
    return {name: float(np.mean([torch_loss(model, x, y) for x, y in batches])) for name, batches in splits.items()}


def pock_finetune(base, scheme, train_batches, held_out, lr):
    model = copy.deepcopy(base)
    x0, y0 = train_batches[0]
    start = time.perf_counter()
    program = pock.compile_training(
        model, x0, y0, loss=token_cross_entropy, optimizer=pock.AdamW(lr=lr, weight_decay=0.0), sparse=scheme
    )
    compile_s = time.perf_counter() - start
    trainer = program.trainer()
    losses, step_times = [], []
    for x, y in train_batches:
        t = time.perf_counter()
        losses.append(trainer.step(x, y))
        step_times.append(time.perf_counter() - t)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in trainer.merged_state_dict().items()}, strict=False)
    return {
        "lr": lr,
        "train_loss": losses,
        **held_out_losses(model, held_out),
        "tokens_per_s": x0.size / float(np.median(step_times[2:])),
        "compile_s": compile_s,
        "trainable": program.signature.trained_values,
        "device_mb": trainer.device_bytes / 2**20,
        "trainer": trainer,
    }


def torch_finetune(base, train_batches, held_out, lr):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, step_times = [], []
    for x, y in train_batches:
        t = time.perf_counter()
        opt.zero_grad()
        loss = token_cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        step_times.append(time.perf_counter() - t)
        losses.append(loss.item())
    return {
        "lr": lr,
        "train_loss": losses,
        **held_out_losses(model, held_out),
        "tokens_per_s": train_batches[0][0].size / float(np.median(step_times[2:])),
        "trainable": sum(p.numel() for p in model.parameters()),
    }


def plot(results: dict, path: Path):
    save_loss_curves(
        {
            f"{name}, lr {r['lr']:g} (test {r['test_loss']:.3f})": np.convolve(
                r["train_loss"], np.ones(10) / 10, mode="valid"
            )
            for name, r in results.items()
        },
        "training loss (nats/char, 10-step mean)",
        "Fine-tuning a char-level LLaMA-like model on stdlib documentation",
        path,
    )


def markdown_report(results: dict, samples: dict) -> str:
    """The table, then the greedy completion of the prompt before and after sparse fine-tuning."""
    full = results[REFERENCE]["test_loss"]
    rows = [
        "| scheme | system | lr (best on val) | test loss | vs PyTorch full | tokens/s | trained values | device MB |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        system = "PyTorch eager" if name == REFERENCE else "pock-mlir"
        trained = f"{r['trainable']:,}" if "trainable" in r else ""
        memory = f"{r['device_mb']:.2f}" if "device_mb" in r else ""
        rows.append(
            f"| {name} | {system} | {r['lr']:g} | {r['test_loss']:.3f} | "
            f"{100 * (r['test_loss'] / full - 1):+.1f}% | {r['tokens_per_s']:.0f} | {trained} | {memory} |"
        )
    rows += [
        "",
        f"Greedy completion of `{samples['prompt']!r}` through the compiled forward:",
        "",
        f"- before fine-tuning: `{samples['before']!r}`",
        f"- after (sparse preset): `{samples['after']!r}`",
    ]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bases",
        action="store_true",
        help="train only the sparse preset and LoRA over a float32 and an int4 base, written to "
        "OUT/language_bases.* (not with --search)",
    )
    args, budgets, out = parse(parser, argv)
    if args.bases and budgets:
        parser.error("--bases trains hand-written schemes only: drop --search")
    stem = "language_bases" if args.bases else "language"

    cfg = LlamaConfig(vocab=VOCAB, max_len=64, dim=96, heads=4, kv_heads=2, layers=4, hidden=256)
    batch = 8
    pretrain_steps, finetune_steps, held_out_count = (40, 10, 2) if args.quick else (600, 150, 16)
    learning_rates = LEARNING_RATES[1:2] if args.quick else LEARNING_RATES
    source, docs = encode(source_corpus()), encode(documentation_corpus())
    train_end, val_end = int(0.8 * len(docs)), int(0.9 * len(docs))
    torch.manual_seed(args.seed)
    print(f"pretraining on {len(source)} characters of stdlib source", flush=True)
    base = pretrain(
        LlamaLike(cfg),
        lambda rng: windows(source, cfg.max_len, batch, rng),
        token_cross_entropy,
        pretrain_steps,
        args.seed,
    )
    train_batches = fixed_batches(docs[:train_end], cfg.max_len, batch, finetune_steps, args.seed + 1)
    held_out = {
        "val_loss": fixed_batches(docs[train_end:val_end], cfg.max_len, batch, held_out_count, args.seed + 2),
        "test_loss": fixed_batches(docs[val_end:], cfg.max_len, batch, held_out_count, args.seed + 3),
    }

    results, sweeps, trainers = {}, {}, {}

    def sweep(schemes: dict) -> None:
        """Each scheme at every learning rate; results keeps the best on the validation split."""
        for name, scheme in schemes.items():
            sweeps[name] = []
            for lr in learning_rates:
                if scheme == "torch":
                    r = torch_finetune(base, train_batches, held_out, lr)
                else:
                    r = pock_finetune(base, scheme, train_batches, held_out, lr)
                trainer = r.pop("trainer", None)
                sweeps[name].append({k: r[k] for k in ("lr", "val_loss", "test_loss")})
                print(
                    f"{name}, lr {lr:g}: val loss {r['val_loss']:.3f}, test loss {r['test_loss']:.3f}, "
                    f"{r['tokens_per_s']:.0f} tokens/s",
                    flush=True,
                )
                if name not in results or r["val_loss"] < results[name]["val_loss"]:
                    results[name], trainers[name] = r, trainer

    chosen = (QUICK_BASES if args.bases else QUICK_SCHEMES) if args.quick else BASES_SCHEMES if args.bases else SCHEMES
    hand_written = {n: s for n, s in SCHEMES.items() if n in chosen}
    sweep({REFERENCE: "torch", **{f"pock {n}": s for n, s in hand_written.items()}})
    at = (
        {results[f"pock {n}"]["device_mb"]: n for n in SEARCH_AGAINST if f"pock {n}" in results}
        if budgets == PRESETS
        else dict.fromkeys(budgets)
    )
    searched = searched_schemes(
        out,
        "language",
        at,
        {
            n: SCHEMES[n]["quantize"]["frozen"]
            for n in SEARCH_AGAINST
            if isinstance(SCHEMES[n], dict) and "quantize" in SCHEMES[n]
        },
    )
    if searched:
        search(base, train_batches, held_out["val_loss"], searched, args.seed, args.quick)
        sweep({f"pock {s.name}": s.file for s in searched})
    results = in_table_order(results, searched, prefix="pock ")

    prompt = "Return a new "
    # the base model's forward alone: a module of evaluate, without the step the completion never takes
    program_before = pock.compile_training(
        copy.deepcopy(base), *train_batches[0], loss=token_cross_entropy, functions=()
    )
    program_before.module(("evaluate",))
    samples = {
        "before": greedy_completion(program_before.trainer().evaluate, prompt, (batch, cfg.max_len), 40),
        "after": greedy_completion(
            trainers["pock sparse preset (last 2 blocks)"].evaluate, prompt, (batch, cfg.max_len), 40
        ),
    }
    report = markdown_report(results, {"prompt": prompt, **samples})
    print(report)
    atomic_write(
        out / f"{stem}.json",
        json.dumps(
            {
                "config": cfg.__dict__,
                "pretrain_steps": pretrain_steps,
                "finetune_steps": finetune_steps,
                "results": results,
                "sweeps": sweeps,
                "samples": {"prompt": prompt, **samples},
            },
            indent=1,
        ),
    )
    atomic_write(out / f"{stem}.md", report + "\n")
    plot(results, out / f"{stem}.png")
    save_against_memory(
        {name: (r["device_mb"], r["test_loss"]) for name, r in results.items() if "device_mb" in r},
        "test loss (nats/char)",
        "Language fine-tuning: test loss against training memory",
        out / f"{stem}_memory.png",
    )


if __name__ == "__main__":
    main()
