"""pock-train: train a device bundle (from pock-compile) on a dataset, without PyTorch.

    pock-train BUNDLE --data DATA.npz [--epochs N] [--batch-size B] [--device local-task|local-sync|vulkan|cuda]
               [--checkpoint PATH [--resume] [--checkpoint-every N]] [--max-steps N] [--seed S] [--export PATH]
               [--export-adapters DIR] [--export-pretrained DIR [--export-lora merge|peft]
               [--max-shard-size SIZE]] [--on-nonfinite stop|skip]

DATA.npz (numpy.savez) holds, first dimension = samples:
    x_train, y_train   the training inputs and targets
    x_val, y_val       a held-out split, evaluated after every epoch (optional)
A model with several inputs takes x0_train, x1_train, ... (and x0_val, ...) in its input order;
inputs the model takes by keyword (an example batch that is a dict, as model(**batch)) are named
by their keywords: input_ids_train, attention_mask_train, decoder_input_ids_train, ...
Each array's other dimensions and its dtype are those of the bundle's batch (manifest.json,
"batch"); int64 is accepted where the bundle takes int32. The bundle is compiled for one batch
size, so each epoch trains on the full batches of a fresh permutation of the training split
(drawn from --seed and the epoch number) and evaluates the full batches of the held-out split.

A next-token model (input (B, T) token ids, target (B, T): the ids one position on) trains on a
tokenized text instead: DATA.npz holds
    tokens_train       a 1-D array of integer token ids, the text in order
    tokens_val         a held-out text (optional)
Each is cut into non-overlapping windows of T tokens, window i being tokens[i*T : (i+1)*T] with
target tokens[i*T+1 : (i+1)*T+1]; the windows are the samples above (shuffled the same way).
For these models the epoch lines and the summary report tokens/s: tokens trained on per second
of training steps (data transfer included; evaluation and checkpoints not).

--checkpoint PATH is written at the end of every epoch, every --checkpoint-every steps and when
training stops (atomically, see pock_mlir/files.py); --resume continues from it with the
results an uninterrupted run would have had. --epochs and --max-steps count from the start of
training, resumed runs included. The tuned weights are exported as a PyTorch state_dict
(--export, default BUNDLE/tuned.safetensors): model.load_state_dict(safetensors.torch.load_file(PATH)).
A bundle with LoRA adapters exports its weights with the adapters merged in (PEFT's
merge_and_unload); --export-adapters DIR also writes the adapters in PEFT's own format, which
peft.PeftModel.from_pretrained(model, DIR) loads onto the original model. A bundle of a
transformers model (it carries the model's config.json) also exports as a Hugging Face model
directory with --export-pretrained DIR, which AutoModelForCausalLM.from_pretrained(DIR) loads:
safetensors files of at most --max-shard-size (default 50GB), LoRA adapters merged, or with
--export-lora peft beside the base in PEFT's format (pock_mlir/runtime/export.py).

Input that does not fit (data, bundle, device, checkpoint, output paths) is reported, naming what
differs, with exit code 1 before anything is written; class labels are checked against the
model's classes. A run locks its checkpoint and export (.NAME.lock beside them): a second run on
them refuses. A batch whose loss is NaN or infinite is never applied: the run stops with exit code
1, keeping the last checkpoint and export (--on-nonfinite skip skips such batches instead).

Ctrl-C stops with exit code 130 after the step under way: the weights of the last step are
exported (a second Ctrl-C skips that), the last checkpoint stays valid, and the message says
where both are.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pock_mlir import lora
from pock_mlir.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from pock_mlir.data import DataError, Split, batch_order, evaluate, load_data
from pock_mlir.files import OutputError, atomic_file, check_writable
from pock_mlir.runtime import InputError, ModuleError, NonFiniteLossError, Trainer
from pock_mlir.runtime.bundle import Bundle, BundleError, load_bundle
from pock_mlir.runtime.export import DEFAULT_MAX_SHARD_SIZE, MODES, ExportError, check_export, write_safetensors
from pock_mlir.targets import DRIVERS, TargetError
from pock_mlir.tools.cli import run_tool, tool_parser

# A checkpoint's "progress": the next batch (epoch, batch), the data order's seed and size, and
# the seed of the next step's dropout masks.
PROGRESS = ("epoch", "batch", "shuffle_seed", "train_samples", "dropout_seed")


class ProgressBar:
    """One stderr line redrawn in place: epoch, batches done, the epoch's mean loss, steps/s (tokens/s
    for a token stream: tokens_per_step > 0). Rates count the time spent in training steps only.
    When stderr is not a terminal (a log file), a line is written every LOG_SECONDS and at the
    epoch's end instead, so that the log holds no redraws."""

    WIDTH = 24
    LOG_SECONDS = 10.0

    def __init__(self, epoch: int, epochs: int, batches: int, tokens_per_step: int = 0):
        self.label, self.batches, self.tokens_per_step = f"epoch {epoch + 1}/{epochs}", batches, tokens_per_step
        self.terminal = sys.stderr.isatty()
        self.drawn = time.perf_counter()
        self.losses: list[float] = []
        self.step_seconds = 0.0

    def update(self, done: int, loss: float, seconds: float, final: bool = False) -> None:
        self.losses.append(loss)
        self.step_seconds += seconds
        now = time.perf_counter()
        if not final and now - self.drawn < (0.1 if self.terminal else self.LOG_SECONDS):
            return
        self.drawn = now
        filled = self.WIDTH * done // self.batches
        rate = f"{self.tokens_per_s:.0f} tokens/s" if self.tokens_per_step else f"{self.steps_per_s:.1f} steps/s"
        sys.stderr.write(
            ("\r" if self.terminal else "") + f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
            f"{done}/{self.batches} loss {self.mean_loss:.4f} {rate}" + ("\n" if final or not self.terminal else "")
        )
        sys.stderr.flush()

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses)) if self.losses else float("nan")

    @property
    def steps_per_s(self) -> float:
        return len(self.losses) / max(self.step_seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.steps_per_s * self.tokens_per_step


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("pock-train", __doc__)
    parser.add_argument("bundle", help="a bundle directory written by pock-compile")
    parser.add_argument(
        "--data",
        required=True,
        help="an .npz with x_train, y_train and optionally x_val, y_val; "
        "for a next-token model, tokens_train and optionally tokens_val",
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train in all (default 1)")
    parser.add_argument("--batch-size", type=int, help="must be the bundle's batch size (the default)")
    parser.add_argument(
        "--device", choices=DRIVERS, help="the IREE driver (default: the one chosen for the bundle's program)"
    )
    parser.add_argument("--checkpoint", help="checkpoint file, written at every epoch end and when training stops")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--checkpoint-every", type=int, metavar="N", help="also write the checkpoint every N steps")
    parser.add_argument("--max-steps", type=int, metavar="N", help="stop once N steps are taken in all")
    parser.add_argument("--seed", type=int, help="seed of the data order (default 0; a resumed run keeps its own)")
    parser.add_argument(
        "--export",
        help="where to write the tuned state_dict (default BUNDLE/tuned.safetensors; "
        "LoRA adapters merged into their weights)",
    )
    parser.add_argument(
        "--export-adapters",
        metavar="DIR",
        help="also write the LoRA adapters in PEFT's format (adapter_model.safetensors, "
        "adapter_config.json) into DIR, for peft.PeftModel.from_pretrained",
    )
    parser.add_argument(
        "--export-pretrained",
        metavar="DIR",
        help="also write the tuned model as a Hugging Face directory (config.json, safetensors) that "
        "from_pretrained loads; new, empty or an earlier export, which it replaces",
    )
    parser.add_argument(
        "--export-lora",
        choices=MODES,
        default="merge",
        help="--export-pretrained: LoRA adapters merged into their weights (default), or in PEFT's "
        "format beside the base weights",
    )
    parser.add_argument(
        "--max-shard-size",
        default=DEFAULT_MAX_SHARD_SIZE,
        metavar="SIZE",
        help=f"--export-pretrained: the largest safetensors file, e.g. 5GB or 500MB (default {DEFAULT_MAX_SHARD_SIZE})",
    )
    parser.add_argument(
        "--on-nonfinite",
        choices=("stop", "skip"),
        default="stop",
        help="a batch whose loss is NaN or infinite (the step is never applied): stop with an error, "
        "keeping the last checkpoint and export (default), or skip the batch and count it",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_tool(
        "pock-train",
        _run,
        build_parser().parse_args(argv),
        (
            BundleError,
            TargetError,
            DataError,
            CheckpointError,
            InputError,
            ModuleError,
            NonFiniteLossError,
            lora.LoraError,
            ExportError,
            OSError,
        ),
    )


@contextmanager
def interrupt_after():
    """Hold back Ctrl-C (SIGINT) until the block ends, then raise KeyboardInterrupt: a training
    step and the Trainer's swap of its buffers complete together or not at all."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # not the main thread, or SIGINT handled by someone else: leave it alone
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def export_state_dict(trainer: Trainer, path: Path) -> None:
    """Write the trainer's merged_state_dict() (the PyTorch model's state_dict) atomically, one
    tensor at a time from the device: model.load_state_dict(safetensors.torch.load_file(path))."""
    with atomic_file(path) as f:
        write_safetensors(f, trainer.merged_state_tensors(), {"format": "pt"})


def _export(trainer: Trainer, path: Path, args) -> None:
    export_state_dict(trainer, path)
    if args.export_adapters:
        trainer.export_adapters(args.export_adapters)
    if args.export_pretrained:
        trainer.export_pretrained(args.export_pretrained, lora=args.export_lora, max_shard_size=args.max_shard_size)


def _export_path(args, bundle: Bundle) -> Path:
    return Path(args.export) if args.export else bundle.path / "tuned.safetensors"


def _check_arguments(args, bundle: Bundle) -> None:
    if args.batch_size is not None and args.batch_size != bundle.batch_size:
        raise DataError(
            f"--batch-size {args.batch_size}: the bundle was compiled for batches of {bundle.batch_size} "
            f"(its example batch); recompile with pock-compile on a batch of {args.batch_size}"
        )
    for option in ("epochs", "checkpoint_every", "max_steps"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise DataError(f"--{option.replace('_', '-')} must be at least 1, got {value}")
    if args.resume and not args.checkpoint:
        raise CheckpointError("--resume needs --checkpoint PATH")
    if args.checkpoint_every and not args.checkpoint:
        raise CheckpointError("--checkpoint-every needs --checkpoint PATH")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise DataError(f"--seed must be a non-negative integer, got {args.seed}")
    if args.checkpoint:
        path = Path(args.checkpoint)
        if args.resume and not path.exists():
            raise CheckpointError(f"no checkpoint at {path} to resume from")
        if not args.resume and path.exists():
            raise CheckpointError(f"{path} exists: pass --resume to continue from it, or remove it to start over")
        check_writable(path)
    check_writable(_export_path(args, bundle))
    if args.export_adapters:
        signature = bundle.signature
        lora.check_exportable([p.name for p in signature.params], signature.adapters, signature.trainable)
        lora.check_adapter_directory(args.export_adapters)
    if args.export_pretrained:
        check_export(args.export_pretrained, bundle.signature, bundle.hf_files, args.export_lora, args.max_shard_size)
    elif args.export_lora != "merge" or args.max_shard_size != DEFAULT_MAX_SHARD_SIZE:
        raise ExportError("--export-lora and --max-shard-size need --export-pretrained DIR")


def _resume(args, bundle: Bundle, train: Split) -> tuple[dict | None, dict]:
    """(checkpoint, progress): where training starts, checked against this run's data and seed."""
    if not args.resume:
        return None, {
            "epoch": 0,
            "batch": 0,
            "shuffle_seed": 0 if args.seed is None else args.seed,
            "train_samples": len(train),
            "dropout_seed": 0,
        }
    checkpoint = load_checkpoint(args.checkpoint, bundle)
    progress = checkpoint.progress
    if not isinstance(progress, dict):
        raise CheckpointError(f"{args.checkpoint}: its progress is {type(progress).__name__}, not pock-train's record")
    missing = [key for key in PROGRESS if type(progress.get(key)) is not int or progress[key] < 0]
    if missing:
        raise CheckpointError(
            f"{args.checkpoint} lacks pock-train's position in the data ({', '.join(missing)} must "
            f"be non-negative integers); was it written by pock-train?"
        )
    if progress["batch"] >= len(train) // bundle.batch_size:
        raise CheckpointError(
            f"{args.checkpoint} says batch {progress['batch']} of an epoch, but an epoch has "
            f"{len(train) // bundle.batch_size} batches"
        )
    if args.seed is not None and args.seed != progress["shuffle_seed"]:
        raise CheckpointError(
            f"--seed {args.seed}: {args.checkpoint} was trained with seed {progress['shuffle_seed']}; "
            f"resuming keeps the run's data order (leave --seed out)"
        )
    if progress["train_samples"] != len(train):
        raise CheckpointError(
            f"{args.checkpoint} was trained on {progress['train_samples']} samples, "
            f"{args.data} has {len(train)}: resuming would not continue the same data order"
        )
    return checkpoint, progress


def open_trainer(bundle: Bundle, device: str, on_nonfinite: str) -> Trainer:
    try:
        return Trainer.from_bundle(bundle, device, on_nonfinite={"stop": "raise", "skip": "skip"}[on_nonfinite])
    except ModuleError:
        raise
    except (RuntimeError, ValueError) as e:  # IREE: no such driver or no device for it
        raise TargetError(f"cannot run the bundle on IREE device '{device}': {e}") from None


def _run(args) -> int:
    bundle = load_bundle(args.bundle)
    device = args.device or bundle.driver
    bundle.target.check_runtime(device)
    _check_arguments(args, bundle)
    train, val = load_data(args.data, bundle)
    checkpoint, progress = _resume(args, bundle, train)
    export = _export_path(args, bundle)
    # Everything is checked: from here on files are written, by this run alone.
    locks = [hold_lock(path) for path in (args.checkpoint, export, args.export_pretrained) if path]
    try:
        return _train(args, bundle, device, train, val, checkpoint, progress, export)
    finally:
        for fd in locks:
            os.close(fd)


def _train(
    args, bundle: Bundle, device: str, train: Split, val: Split | None, checkpoint, progress: dict, export: Path
) -> int:
    trainer = open_trainer(bundle, device, args.on_nonfinite)
    if checkpoint:
        trainer.load_state_dict(checkpoint.state_dict)
        trainer.load_optimizer_state(checkpoint.optimizer_state)
        trainer.seed = progress["dropout_seed"]
    steps = checkpoint.steps if checkpoint else 0
    saved_at = steps if checkpoint else None
    batch_size, seed = bundle.batch_size, progress["shuffle_seed"]
    tokens_per_step = batch_size * train.tokens_per_sample  # 0 unless the data is a token stream
    run_steps, run_seconds = 0, 0.0  # this run's training steps, for the summary's tokens/s

    def write_checkpoint(epoch: int, batch: int) -> None:
        nonlocal saved_at
        if args.checkpoint:
            position = {"epoch": epoch, "batch": batch, "dropout_seed": trainer.seed}
            save_checkpoint(args.checkpoint, trainer, {**progress, **position}, bundle.module_sha256)
            saved_at = steps

    if checkpoint:
        print(f"resumed from {args.checkpoint}: epoch {progress['epoch'] + 1}, step {steps}")

    def stop(steps: int) -> bool:
        return args.max_steps is not None and steps >= args.max_steps

    try:
        epoch = progress["epoch"]
        while epoch < args.epochs and not stop(steps):
            order = batch_order(seed, epoch, len(train), batch_size)
            done = progress["batch"] if epoch == progress["epoch"] else 0
            bar = ProgressBar(epoch, args.epochs, len(order), tokens_per_step)
            while done < len(order) and not stop(steps):
                started = time.perf_counter()
                with interrupt_after():
                    try:
                        loss = trainer.step(*train.batch(order[done]))
                    except NonFiniteLossError as e:
                        raise NonFiniteLossError(
                            f"epoch {epoch + 1}, batch {done + 1} (samples {', '.join(map(str, order[done][:4]))}"
                            f"{', ...' if batch_size > 4 else ''}), step {steps + 1}: {e}; stopped. "
                            + _where_the_state_is(args, saved_at, export)
                            + " (--on-nonfinite skip skips such batches)"
                        ) from None
                    seconds = time.perf_counter() - started
                    steps, done, run_steps, run_seconds = steps + 1, done + 1, run_steps + 1, run_seconds + seconds
                bar.update(done, loss, seconds, final=done == len(order) or stop(steps))
                # The epoch end and the stop write their own checkpoint.
                if (
                    args.checkpoint_every
                    and steps % args.checkpoint_every == 0
                    and done < len(order)
                    and not stop(steps)
                ):
                    write_checkpoint(epoch, done)
            if done < len(order):  # stopped by --max-steps inside the epoch
                write_checkpoint(epoch, done)
                break
            metrics = evaluate(trainer, val, batch_size) if val else {}
            print(
                f"epoch {epoch + 1}/{args.epochs}: loss {bar.mean_loss:.4f}"
                + "".join(f", {k} {v:.4f}" for k, v in metrics.items())
                + f", step {steps}"
                + (f", {bar.tokens_per_s:.0f} tokens/s" if tokens_per_step else ""),
                flush=True,
            )
            epoch += 1
            write_checkpoint(epoch, 0)
        try:
            _export(trainer, export, args)
        except OSError as e:
            raise OutputError(f"{e}; {_where_the_state_is(args, saved_at, export)}") from None
    except KeyboardInterrupt:
        print(
            f"\npock-train: interrupted at step {steps}; exporting its weights (Ctrl-C again to skip)",
            file=sys.stderr,
            flush=True,
        )
        try:
            _export(trainer, export, args)
            weights = f"the tuned weights of step {steps} are in {export}"
        except KeyboardInterrupt:
            weights = f"the weights were not exported ({export} is as it was)"
        kept = (
            f"; {args.checkpoint} holds step {saved_at} (--resume continues from there)"
            if args.checkpoint and saved_at is not None
            else ""
        )
        print(f"pock-train: stopped: {weights}{kept}", file=sys.stderr)
        return 130
    throughput = ""
    if tokens_per_step and run_steps:
        throughput = (
            f" ({run_steps * tokens_per_step:,} tokens in this run, "
            f"{run_steps * tokens_per_step / run_seconds:,.0f} tokens/s)"
        )
    skipped = f", skipped {trainer.skipped_steps} batch(es) with a non-finite loss" if trainer.skipped_steps else ""
    print(f"trained {steps} steps in all{throughput}{skipped}; tuned weights in {export}")
    return 0


def _where_the_state_is(args, saved_at: int | None, export: Path) -> str:
    if args.checkpoint and saved_at is not None:
        return f"{args.checkpoint} holds step {saved_at} (--resume continues from there); {export} is as it was"
    return f"{export} is as it was (--checkpoint PATH keeps the state of long runs)"


def hold_lock(path) -> int:
    """Lock `path`'s lock file (.NAME.lock beside it) until the returned descriptor is closed, so
    that two runs never write one checkpoint or export; refuses when another run holds it."""
    path = Path(path)
    lock_path = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise OutputError(f"cannot lock {path} (lock file {lock_path}): {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OutputError(
            f"another pock-train is writing {path}; wait for it to finish or choose another path"
        ) from None
    return fd


if __name__ == "__main__":
    sys.exit(main())
