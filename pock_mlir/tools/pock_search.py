"""pock-search: search which parameters and channels to train under a memory and time budget.

    pock-search MODEL.py --data DATA.npz --memory-budget 40MB [--time-budget 0.5] [--optimizer sgd:lr=0.01]
                [--steps 10] [--anchor auto|none|NAME,...] [--quantize int8|int4] [--seed 0] -o scheme.yaml

MODEL.py is a model file as pock-compile reads it (model(), example_batch(), optionally LOSS,
OUTPUT and WEIGHTS, the checkpoint a meta-device model's weights start from); the example batch
sets the batch size. DATA.npz is laid out as pock-train reads it (x_train, y_train, x_val, y_val;
or tokens_train, tokens_val): every candidate fine-tunes on the training split and is judged on
the held-out one, which it needs. --memory-budget is the device
memory training may hold (as Trainer.device_bytes counts it): bytes, or a number with KB, MB or GB
(powers of 1024). --time-budget is the step's time as a fraction of the full-BP step. --anchor is
what every candidate trains with and every scheme holds: the last layer (auto), nothing (none), or
parameter names separated by commas. --quantize int8 searches schemes over an int8 frozen base (the
sparse config's `quantize: {frozen: int8}`; int4 over an int4 one). The scheme is
written as a sparse config (pock-compile --sparse, compile_training(sparse=)) with a comment per
entry; the table of what was measured goes to stdout, progress to stderr. How the search works and
what it costs: pock_mlir/search.py. Errors print one message and exit with code 1, before any
compilation where they can be known then; an existing -o file is replaced only if pock-search wrote it.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys

import torch

from pock_mlir.abi import StepSignature, positional_input_name
from pock_mlir.data import load_data
from pock_mlir.quantize import FORMATS
from pock_mlir.tools.cli import run_tool, tool_parser
from pock_mlir.tools.pock_compile import USER_ERRORS, load_model_file

UNITS = {"": 1, "b": 1, "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20, "gb": 2**30, "gib": 2**30}


def parse_size(text: str) -> float:
    """'40MB', '512KB', '1.5GiB' or bytes ('2000000'), in MB of 2**20 bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"--memory-budget {text!r}: give a size such as 40MB, 512KB, 1.5GB or a number of bytes")
    return float(match.group(1)) * UNITS[match.group(2).lower()] / 2**20


class ExampleBatch:
    """What pock-train's load_data checks data against, read off the model file's example batch
    (the bundle the data would train, before it is compiled)."""

    def __init__(self, file, path: str):
        from pock_mlir.frontend import as_tensor, call_tensors, device_dtype, select_output, spec_of

        args, kwargs = call_tensors(file.inputs)
        model = copy.deepcopy(file.model)  # a copy: a forward in train mode would move BatchNorm's statistics
        if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            # built on the meta device, its weights in WEIGHTS' files: the output's shape from a forward there
            model = model.to("meta")
            args, kwargs = tuple(a.to("meta") for a in args), {k: v.to("meta") for k, v in kwargs.items()}
        with torch.no_grad():
            output = select_output(model(*args, **kwargs), file.output)
        named = [(positional_input_name(i), t) for i, t in enumerate(args)] + list(kwargs.items())
        self.signature = StepSignature(
            params=[],
            buffers=[],
            updated_buffers=[],
            trainable=[],
            state=[],
            inputs=[spec_of(name, device_dtype(t)) for name, t in named],
            by_keyword=len(kwargs),
            target=spec_of("target", device_dtype(as_tensor(file.target))),
            output=spec_of("output", output),
        )
        self.batch_size = self.signature.target.shape[0] if self.signature.target.shape else 1
        self.path = f"{path} (its example batch)"


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("pock-search", __doc__)
    parser.add_argument("model", help="the model file (MODEL.py, as pock-compile reads it)")
    parser.add_argument(
        "--data",
        required=True,
        help="an .npz with x_train, y_train, x_val, y_val (or tokens_train, tokens_val), as pock-train reads it",
    )
    parser.add_argument("--memory-budget", help="device memory for training: 40MB, 512KB, bytes")
    parser.add_argument(
        "--time-budget", type=float, help="the step's time as a fraction of the full-BP step, in (0, 1]"
    )
    parser.add_argument(
        "--optimizer",
        default="sgd:lr=0.01",
        help="the fine-tuning optimizer, as pock-compile takes it (default sgd:lr=0.01)",
    )
    parser.add_argument("--steps", type=int, default=10, help="fine-tuning steps per candidate (default 10)")
    parser.add_argument(
        "--anchor",
        default="auto",
        help="trained with every candidate and kept in the scheme: auto (the last layer), none, "
        "or parameter names separated by commas (default auto)",
    )
    parser.add_argument(
        "--quantize",
        choices=FORMATS,
        help="store the scheme's frozen layer weights so (an int8 or int4 base; default: float32)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the batches' order (default 0)")
    parser.add_argument("-o", "--output", required=True, help="the scheme to write (.yaml)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_tool("pock-search", _run, build_parser().parse_args(argv), USER_ERRORS, "interrupted; nothing written")


def _run(args) -> int:
    from pock_mlir.optim import parse_optimizer
    from pock_mlir.search import Budget, check_scheme_path, search_sparse

    if args.memory_budget is None and args.time_budget is None:
        raise ValueError("give --memory-budget, --time-budget or both")
    budget = Budget(
        memory_mb=None if args.memory_budget is None else parse_size(args.memory_budget), step_time=args.time_budget
    )
    try:
        optimizer = parse_optimizer(args.optimizer)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--optimizer {args.optimizer}: {e}") from None
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    check_scheme_path(args.output)
    file = load_model_file(args.model)
    shape = ExampleBatch(file, args.model)
    train, val = load_data(args.data, shape)
    if val is None:
        raise ValueError(
            f"{args.data} has no held-out split (x_val, y_val or tokens_val): the search judges every candidate on it"
        )
    anchor = {"auto": "auto", "none": None}.get(args.anchor, args.anchor.split(","))
    result = search_sparse(
        file.model,
        train,
        val,
        budget=budget,
        loss=file.loss,
        optimizer=optimizer,
        steps=args.steps,
        anchor=anchor,
        batch_size=shape.batch_size,
        seed=args.seed,
        output=file.output,
        quantize=args.quantize,
        weights=file.weights,
        progress=True,
    )
    path = result.write(args.output)
    print(result.table())
    print(f"wrote {path}: pock-compile {args.model} --sparse {path} -o BUNDLE compiles it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
