"""pock-compile: compile a model file's training step into a device bundle.

    pock-compile MODEL.py [--sparse CONFIG] [--optimizer sgd:lr=0.01,momentum=0.9] [--target aarch64]
                 [--tuning table.json [--tuning-any]] -o bundle/
    pock-compile HF_DIR --task causal-lm --seq-len 128 [--batch 1] [--sparse ...] -o bundle/

MODEL.py is a Python file defining, at module level:
    model()          -> the torch.nn.Module to train (with the weights to start from)
    example_batch()  -> (inputs, target): one batch of the shape to train on; inputs is a tensor, a
                        tuple of tensors, a dict of them by keyword (model(**inputs), e.g. input_ids,
                        attention_mask, decoder_input_ids), or a tuple ending in such a dict. The
                        bundle trains on batches of exactly this shape and these keywords.
    LOSS             "cross_entropy" (the default when absent), "mse", or a callable loss(output, target)
                     receiving the model's output as it is (a tensor, tuple, dict, dataclass, ModelOutput)
    OUTPUT           optional, for a model returning a structure: the entry evaluate returns (a key,
                     attribute or index; by default `logits` where there is one, else the first entry)
    WEIGHTS          optional: a Hugging Face model directory or .safetensors file (relative to the
                     model file's directory) the weights start from; model() may then build the model
                     on the meta device (compile_training's weights=, pock_mlir/weights.py)
It is run with its own directory on sys.path, so it can import modules next to it. examples/ has
ready ones.

HF_DIR, a Hugging Face model directory (config.json and model.safetensors or its shards), with
--task causal-lm: the model is transformers' AutoModelForCausalLM built from config.json on the
meta device, its weights read from the directory's files one tensor at a time (bfloat16 and float16
ones as float32); the batch is --batch sequences of --seq-len token ids (input_ids), the target the
next token at each position, the loss token cross-entropy (causal_lm_loss).

MODEL.onnx, an ONNX inference model, compiles as it is: its float initializers are the
parameters (a sparse config names them), the batch has the file's input shapes or --input-shape's,
the target suits --loss on the graph's first output or --output-name's (docs/onnx.md).

The bundle's layout is described in pock_mlir/runtime/bundle.py; run_step.sh in it runs one step
with the stock iree-run-module. Errors print one message and exit with code 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import traceback
from pathlib import Path
from typing import NamedTuple

from pock_mlir.bundle import check_destination, kept_files, write_bundle
from pock_mlir.optim import parse_optimizer
from pock_mlir.targets import resolve_target, target_help
from pock_mlir.tools.cli import run_tool, tool_parser

USER_ERRORS = (ValueError, RuntimeError, OSError)


class ModelFileError(ValueError):
    pass


class ModelFile(NamedTuple):
    model: object
    inputs: object
    target: object
    loss: object
    output: object  # OUTPUT, None when absent
    weights: object = None  # WEIGHTS, None when absent


TASKS = ("causal-lm",)


def causal_lm_loss(output, target):
    """Next-token cross-entropy: the logits (B, T, V) against the next token (B, T) at each position."""
    import torch.nn.functional as F

    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten().long())


def load_checkpoint_directory(path: str, task: str | None, batch: int, seq_len: int | None) -> ModelFile:
    """A Hugging Face model directory as --task builds it (see the module docstring)."""
    directory = Path(path)
    if task is None:
        raise ModelFileError(
            f"{path} is a directory: give --task {'/'.join(TASKS)} to build its model from config.json"
        )
    if not (directory / "config.json").is_file():
        raise ModelFileError(f"{path} has no config.json: give a Hugging Face model directory")
    if seq_len is None or seq_len < 1 or batch < 1:
        raise ModelFileError(
            f"--task {task}: give --seq-len (and --batch, default 1), the shape of the batches to train on"
        )
    import torch
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(directory)
        with torch.device("meta"):
            # float32 whatever config.json's dtype (that of the files): pock-mlir trains float32
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise ModelFileError(f"{path}/config.json: transformers cannot build a causal LM from it ({e})") from None
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # a training step returns no key/value cache
    ids = torch.zeros((batch, seq_len), dtype=torch.int64)
    return ModelFile(model, {"input_ids": ids}, ids.clone(), causal_lm_loss, None, directory)


def load_model_file(path: str) -> ModelFile:
    """Run MODEL.py (see the module docstring)."""
    file = Path(path)
    if not file.is_file():
        raise ModelFileError(f"{path}: no such file")
    if file.suffix != ".py":  # importlib finds no loader for any other name
        kind = f"a {file.suffix} file" if file.suffix else "a file without the .py suffix"
        raise ModelFileError(
            f"{path} is {kind}; a model file is Python source named MODEL.py, defining model() and "
            f"example_batch() (see --help)"
        )
    sys.path.insert(0, str(file.resolve().parent))
    spec = importlib.util.spec_from_file_location(f"pock_model_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        missing = [name for name in ("model", "example_batch") if not callable(getattr(module, name, None))]
        if missing:
            raise ModelFileError(
                f"{path} must define {' and '.join(f'{m}()' for m in missing)} (see pock-compile --help)"
            )
        model = module.model()
        batch = module.example_batch()
    except ModelFileError:
        raise
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise ModelFileError(f"{path} failed: {type(e).__name__}: {e} ({where.filename}:{where.lineno})") from None
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ModelFileError(f"{path}: example_batch() must return (inputs, target), got {type(batch).__name__}")
    weights = getattr(module, "WEIGHTS", None)
    return ModelFile(
        model,
        batch[0],
        batch[1],
        getattr(module, "LOSS", "cross_entropy"),
        getattr(module, "OUTPUT", None),
        None if weights is None else file.resolve().parent / weights,
    )


def _input_shapes(values: list[str]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for value in values:
        name, equals, dims = value.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            shape = ()
        if not equals or not name or not shape or min(shape) <= 0:
            raise ModelFileError(f"--input-shape {value}: give NAME=DIMS, e.g. x=4x3x32x32")
        shapes[name] = shape
    return shapes


def load_onnx_file(args) -> ModelFile:
    """An .onnx model with a zero batch of its input shapes and a target for --loss."""
    from pock_mlir.onnx_frontend import example_batch

    if not Path(args.model).is_file():
        raise ModelFileError(f"{args.model}: no such file")
    inputs, target = example_batch(args.model, _input_shapes(args.input_shape), args.loss, args.output_name)
    return ModelFile(args.model, inputs, target, args.loss, args.output_name)


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("pock-compile", __doc__)
    parser.add_argument(
        "model", help="the model file (MODEL.py or MODEL.onnx), or a Hugging Face model directory with --task"
    )
    parser.add_argument(
        "--task", choices=TASKS, default=None, help="for a model directory: the model to build from its config.json"
    )
    parser.add_argument("--seq-len", type=int, default=None, help="with --task: the tokens of each sequence")
    parser.add_argument("--batch", type=int, default=1, help="with --task: the sequences of each batch (default 1)")
    parser.add_argument(
        "-o", "--output", required=True, help="the bundle directory to write (replaced if it is a bundle)"
    )
    parser.add_argument("--target", default="host", help=target_help())
    parser.add_argument(
        "--optimizer",
        default="sgd:lr=0.01",
        help="sgd:lr=...,momentum=...,dampening=...,weight_decay=...,nesterov=true or "
        "adamw:lr=...,betas=0.9/0.999,eps=...,weight_decay=... (default sgd:lr=0.01)",
    )
    parser.add_argument(
        "--sparse",
        default=None,
        help="which parameters to train: a YAML/JSON sparse-update config or a preset (full, the default; "
        "bias-only, last-K, mobilenet-last-K, transformer-last-K); see pock_mlir/sparse.py",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=4x3x32x32",
        help="MODEL.onnx: the batch shape of a graph input whose file shape is not static (repeat per input)",
    )
    parser.add_argument(
        "--loss", choices=("cross_entropy", "mse"), default="cross_entropy", help="MODEL.onnx: the loss"
    )
    parser.add_argument(
        "--output-name", default=None, help="MODEL.onnx: the graph output to train on (default: the first)"
    )
    parser.add_argument(
        "--tuning",
        default=None,
        help="a table pock-tune measured on the device, to choose each implementation by (see "
        "docs/tuning-for-your-device.md); one from another device, target or IREE runtime is refused",
    )
    parser.add_argument(
        "--tuning-any",
        action="store_true",
        help="use the --tuning table even if measured on another device, target or IREE runtime",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="compile with IREE even if the compile cache holds this program (see pock_mlir/cache.py)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print each compilation stage as it goes and where the time went (compile_report) on stderr "
        "(the default when stderr is a terminal)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    # User-facing errors (bad model file, target, optimizer, sparse config, a model the frontend or
    # IREE rejects) are ValueError, RuntimeError (CompileError, IREE) or OSError subclasses.
    return run_tool("pock-compile", _run, build_parser().parse_args(argv), USER_ERRORS, "interrupted; nothing written")


def _run(args) -> int:
    # Cheap checks first: a typo should not cost a compilation.
    resolve_target(args.target)
    try:
        optimizer = parse_optimizer(args.optimizer)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--optimizer {args.optimizer}: {e}") from None
    kept = kept_files(check_destination(args.output))
    if args.tuning_any and args.tuning is None:
        raise ValueError("--tuning-any applies to a --tuning table; give one")
    if args.tuning is not None:
        from pock_mlir.tuning import Tuning

        Tuning.from_file(args.tuning, args.target, args.tuning_any)  # a foreign table is refused before any work
    if args.task is not None and not Path(args.model).is_dir():
        raise ModelFileError(f"--task {args.task} takes a Hugging Face model directory; {args.model} is none")
    if Path(args.model).is_dir():
        file = load_checkpoint_directory(args.model, args.task, args.batch, args.seq_len)
    elif args.model.endswith(".onnx"):
        file = load_onnx_file(args)
    else:
        file = load_model_file(args.model)

    from pock_mlir.compiler import compile_training

    start = time.perf_counter()
    program = compile_training(
        file.model,
        file.inputs,
        file.target,
        loss=file.loss,
        optimizer=optimizer,
        sparse=args.sparse,
        target=args.target,
        output=file.output,
        cache=not args.no_cache,
        verbose=args.verbose or sys.stderr.isatty(),
        functions="all",
        weights=file.weights,
        tuning=args.tuning,
        tuning_any=args.tuning_any,
    )
    bundle = write_bundle(
        program,
        args.output,
        example_inputs=file.inputs,
        example_target=file.target,
        loss=file.loss,
        model_file=Path(args.model).name,
        sparse=args.sparse,
    )
    sig = program.signature
    print(
        f"wrote {bundle}/ for target {program.target.name} in {time.perf_counter() - start:.1f}s: "
        f"{len(program.vmfb) / 1024:.0f} KiB module, {len(sig.trainable)} of {len(sig.params)} parameter tensors "
        f"trained, batch {tuple(sig.inputs[0].shape)}"
    )
    if kept:
        print(f"kept from the earlier bundle there: {', '.join(kept)}")
    if args.tuning is not None:
        print(program.backend_report().splitlines()[-1])  # which table decided, and for what
    if args.verbose or sys.stderr.isatty():
        print(program.compile_report(), file=sys.stderr)
    print(f"one step on the device: {bundle}/run_step.sh; training: pock-train {bundle} --data DATA.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
