"""Fine-tuning a char-level LLaMA-like model on text, sparsely, through pock-mlir.

As a model file for pock-compile: model() is a LLaMA-like decoder (examples/models/transformer.py)
over ASCII characters, starting from the weights in $LLAMA_TEXT_WEIGHTS (a PyTorch state_dict
file; a fresh initialisation when unset); example_batch() is BATCH windows of SEQ characters;
LOSS is next-token cross-entropy. load_data() is the fine-tuning text as pock-train's token
streams (tokens_train, tokens_val): the standard library's documentation prose.

Run as a script, it does the whole path, nothing downloaded, in a few minutes on two cores:

    python examples/llama_text.py [--out llama_text_run] [--text FILE] [--epochs N] [--prompt TEXT]
                                  [--targets host,aarch64,cuda] [--quick]

1. pretrains the model in PyTorch on standard-library source code, or reuses OUT/pretrained.pt;
2. writes the fine-tuning text (pydoc's rendering of stdlib modules, or --text FILE) as OUT/text.npz;
3. runs pock-compile with --sparse transformer-last-2, the PockEngine paper's scheme (norms, biases,
   and the attention and first FFN linear of the last two blocks), for host (OUT/host) and, compile
   only, for the other --targets (e.g. aarch64, cuda), printing the bundle sizes;
4. runs pock-train on OUT/host with OUT/text.npz, which reports tokens/s;
5. prints the held-out loss and a greedy completion of a prompt before and after fine-tuning,
   through the compiled model (the bundle's functions on the IREE runtime), not PyTorch.

The same by hand:

    LLAMA_TEXT_WEIGHTS=OUT/pretrained.pt pock-compile examples/llama_text.py --sparse transformer-last-2 \\
        --optimizer adamw:lr=2e-3 -o OUT/host
    pock-train OUT/host --data OUT/text.npz --epochs 2
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from models.char_text import (
    VOCAB,
    decode,
    documentation_corpus,
    encode,
    greedy_completion,
    pretrain,
    source_corpus,
    windows,
)
from models.transformer import LlamaConfig, LlamaLike, token_cross_entropy

from pock_mlir.checkpoint import load_checkpoint
from pock_mlir.files import atomic_save
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.targets import resolve_target

SEQ, BATCH = 64, 16
CONFIG = LlamaConfig(vocab=VOCAB, max_len=SEQ, dim=96, heads=4, kv_heads=2, layers=4, hidden=256)
WEIGHTS_VARIABLE = "LLAMA_TEXT_WEIGHTS"  # the environment variable naming the weights model() starts from
# (not WEIGHTS: pock-compile reads a model file's WEIGHTS as a checkpoint to stream from)
SPARSE = "transformer-last-2"
OPTIMIZER = "adamw:lr=2e-3"
DOCS_PROMPT = "Return a new "
COMPLETION = 48  # characters; the prompt keeps its last SEQ - COMPLETION
QUICK_PRETRAIN_STEPS, QUICK_TEXT_CHARS, QUICK_STEPS = 20, 40_000, 10  # --quick
LOSS = token_cross_entropy


def model() -> nn.Module:
    torch.manual_seed(0)
    llama = LlamaLike(CONFIG)
    if os.environ.get(WEIGHTS_VARIABLE):
        llama.load_state_dict(torch.load(os.environ[WEIGHTS_VARIABLE], weights_only=True))
    return llama


def example_batch():
    x, y = windows(encode(source_corpus()), SEQ, BATCH, np.random.RandomState(0))
    return torch.from_numpy(x), torch.from_numpy(y)


def load_data(text: str | None = None) -> dict[str, np.ndarray]:
    """`text` (default: stdlib documentation) as token ids: the first 90% to train on, the rest held out."""
    tokens = encode(documentation_corpus() if text is None else text)
    split = int(0.9 * len(tokens))
    return {"tokens_train": tokens[:split], "tokens_val": tokens[split:]}


# -- the whole path ---------------------------------------------------------------------------


def console_script(name: str) -> str:
    """pock-mlir's console script `name`: next to this Python (a venv) or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        sys.exit(f"{name} is neither next to {sys.executable} nor on PATH: install pock-mlir (make demo sets up .venv)")
    return found


def run_tool(name: str, *arguments, env: dict | None = None) -> list[str]:
    """Run a console script, echoing its stdout indented (stderr, e.g. pock-train's progress bar, goes
    straight through); its stdout lines, or exit when it fails."""
    command = [console_script(name), *map(str, arguments)]
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}) as process:
        for line in process.stdout:
            print(f"   {line}", end="", flush=True)
            lines.append(line.rstrip("\n"))
    if process.returncode != 0:
        sys.exit(f"{name} failed with exit code {process.returncode}: {' '.join(command)}")
    return lines


def pretrained_weights(out: Path, steps: int) -> Path:
    path = out / "pretrained.pt"
    if path.exists():
        print(f"1. reusing the pretrained weights in {path} (delete it to pretrain again)")
        return path
    source = encode(source_corpus())
    print(f"1. pretraining in PyTorch on {len(source):,} characters of stdlib source ({steps} steps of {BATCH}x{SEQ})")
    torch.set_num_threads(2)
    llama = pretrain(model(), lambda rng: windows(source, CONFIG.max_len, BATCH, rng), LOSS, steps, seed=0)
    torch.save(llama.state_dict(), path)
    return path


def write_text(out: Path, text_file: str | None, max_chars: int | None) -> tuple[Path, dict[str, np.ndarray]]:
    if text_file is None:
        text, what = documentation_corpus(), "the stdlib documentation (pydoc)"
    else:
        try:
            text, what = Path(text_file).read_text(encoding="utf-8", errors="replace"), text_file
        except OSError as e:
            sys.exit(f"cannot read --text {text_file}: {e}")
    if max_chars is not None and len(text) > max_chars:
        text, what = text[:max_chars], f"the first {max_chars:,} characters of {what}"
    data = load_data(text)
    needed = BATCH * SEQ + 1  # one batch of windows, each split (pock-train refuses less)
    if min(len(tokens) for tokens in data.values()) < needed:
        sys.exit(
            f"{what} has {len(text):,} characters; the example needs at least {10 * needed:,} "
            f"(90% to train on, 10% held out, each at least one batch of {BATCH} windows of {SEQ})"
        )
    path = out / "text.npz"
    atomic_save(path, lambda f: np.savez(f, **data))
    print(
        f"2. fine-tuning text: {what}, {len(data['tokens_train']):,} characters to train on and "
        f"{len(data['tokens_val']):,} held out -> {path}"
    )
    return path, data


def compile_bundles(out: Path, weights: Path, targets: list[str]) -> Path:
    print(f"3. pock-compile --sparse {SPARSE} --optimizer {OPTIMIZER} for {', '.join(targets)}")
    sizes = {}
    for target in targets:
        bundle = out / target
        run_tool(
            "pock-compile",
            __file__,
            "--sparse",
            SPARSE,
            "--optimizer",
            OPTIMIZER,
            "--target",
            target,
            "-o",
            bundle,
            env={WEIGHTS_VARIABLE: str(weights)},
        )
        files = [f for f in bundle.rglob("*") if f.is_file()]
        sizes[target] = ((bundle / "module.vmfb").stat().st_size, sum(f.stat().st_size for f in files))
    for target, (module, total) in sizes.items():
        print(f"   {target:8} module {module / 1024:7,.0f} KiB, bundle {total / 2**20:5.1f} MiB")
    return out / "host"


def compiled_model(bundle: Path, checkpoint: Path | None = None) -> Trainer:
    """The bundle's compiled functions on the IREE runtime, with the weights of `checkpoint` if given."""
    loaded = load_bundle(bundle)
    trainer = Trainer.from_bundle(loaded)
    if checkpoint is not None:
        trainer.load_state_dict(load_checkpoint(checkpoint, loaded).state_dict)
    return trainer


def held_out_loss(trainer: Trainer, tokens: np.ndarray) -> float:
    """The mean loss over the full batches of windows of `tokens`, in order (pock-train's val_loss)."""
    windows = (len(tokens) - 1) // SEQ // BATCH * BATCH
    x, y = tokens[: windows * SEQ].reshape(-1, SEQ), tokens[1 : windows * SEQ + 1].reshape(-1, SEQ)
    return float(np.mean([trainer.loss(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, windows, BATCH)]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", help="the working directory (default llama_text_run; llama_text_quick with --quick)")
    parser.add_argument("--text", help="a text file to fine-tune on (default: stdlib documentation)")
    parser.add_argument("--epochs", type=int, default=2, help="fine-tuning epochs (default 2)")
    parser.add_argument("--pretrain-steps", type=int, default=1000, help="PyTorch pretraining steps (default 1000)")
    parser.add_argument(
        "--prompt",
        help=f"the prompt to complete (default {DOCS_PROMPT!r}, or the start of the held-out part of --text)",
    )
    parser.add_argument(
        "--targets",
        default="host",
        help="comma-separated targets to compile for (default host; e.g. host,aarch64,cuda: the "
        "others are only compiled, to show their sizes); host is always one of them",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke test of every stage in about a minute: {QUICK_PRETRAIN_STEPS} pretraining "
        f"steps, the first {QUICK_TEXT_CHARS:,} characters of the text, {QUICK_STEPS} "
        f"fine-tuning steps",
    )
    args = parser.parse_args(argv)
    targets = list(dict.fromkeys(["host", *filter(None, args.targets.split(","))]))
    for target in targets:
        try:
            resolve_target(target)
        except ValueError as e:
            parser.error(f"--targets: {e}")
    for name in ("epochs", "pretrain_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    out = Path(args.out or ("llama_text_quick" if args.quick else "llama_text_run"))
    out.mkdir(parents=True, exist_ok=True)

    weights = pretrained_weights(out, QUICK_PRETRAIN_STEPS if args.quick else args.pretrain_steps)
    data_path, data = write_text(out, args.text, QUICK_TEXT_CHARS if args.quick else None)
    prompt = args.prompt or (DOCS_PROMPT if args.text is None else decode(data["tokens_val"][:16]))
    bundle = compile_bundles(out, weights, targets)

    checkpoint = out / "finetune.ckpt"
    checkpoint.unlink(missing_ok=True)  # each run fine-tunes the pretrained weights afresh
    length = ["--max-steps", QUICK_STEPS] if args.quick else []
    print(f"4. pock-train {bundle} --data {data_path} --epochs {args.epochs} {' '.join(map(str, length))}")
    lines = run_tool(
        "pock-train", bundle, "--data", data_path, "--epochs", args.epochs, "--checkpoint", checkpoint, *length
    )
    tokens_per_s = re.search(r"([\d,]+) tokens/s\)", lines[-1])

    print(f"5. through the compiled model (host bundle, IREE runtime): held-out loss, greedy completion of {prompt!r}")
    for label, tuned in [("before fine-tuning", None), ("after fine-tuning", checkpoint)]:
        trainer = compiled_model(bundle, tuned)
        sample = greedy_completion(trainer.evaluate, prompt, (BATCH, SEQ), COMPLETION)
        print(f"   {label + ':':19} {held_out_loss(trainer, data['tokens_val']):.3f}  {sample!r}")
    if tokens_per_s:
        print(f"fine-tuning ran at {tokens_per_s.group(1)} tokens/s on host ({SPARSE}, batch {BATCH}x{SEQ})")


if __name__ == "__main__":
    main()
