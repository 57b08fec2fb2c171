"""pock-tune: measure which implementation of each of a model's convolutions, and which IREE flags
for its whole training step, run fastest on the device itself; pock-compile --tuning chooses by it.

    pock-tune prepare MODEL.py --target T -o tune-bundle/   # on the build machine (the compiler)
    pock-tune run tune-bundle/ -o table.json                # on the device (the IREE runtime alone)
    pock-tune MODEL.py -o table.json                        # on the host: both
    pock-compile MODEL.py --target T --tuning table.json -o bundle/

prepare compiles, for MODEL.py (as pock-compile reads it), every candidate pock-backend-switch can
choose: each convolution shape of the step in each form of each op (forward, each gradient, both
gradients together), and the whole step under each flag set it chooses between (data tiling,
vector tails on CPUs, fusion). run times them on the device without PyTorch or the compiler, as
pock-train runs, and writes the table: the device (CPU model or GPU), the target, the IREE
runtime version and each candidate's time (and each step's device memory); on a device without
Python, --benchmark-module times them with IREE's stock iree-benchmark-module. A table from another
device, target or runtime version is refused by pock-compile --tuning (--tuning-any uses it,
saying so in program.backend_report()). See docs/tuning-for-your-device.md.

Errors print one message and exit with code 1.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from pock_mlir.runtime.timing import REPEATS
from pock_mlir.runtime.tune import STEPS, run
from pock_mlir.targets import DRIVERS, target_help
from pock_mlir.tools.cli import run_tool, tool_parser

USER_ERRORS = (ValueError, RuntimeError, OSError)


def _prepare_options(parser) -> None:
    parser.add_argument("model", help="the model file (MODEL.py, as pock-compile reads it)")
    parser.add_argument(
        "--optimizer", default="sgd:lr=0.01", help="as pock-compile's (the step is timed with it; default sgd:lr=0.01)"
    )
    parser.add_argument("--sparse", default=None, help="as pock-compile's: which parameters to train")
    parser.add_argument(
        "--sets",
        default=None,
        help="only these of the flag sets pock-backend-switch chooses between (comma-separated; default all)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="candidates compiled at once (default: one per CPU, os.cpu_count())"
    )


def _run_options(parser) -> None:
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"timed calls of each form (default {REPEATS})")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"timed steps of each flag set (default {STEPS})")


def build_parser(command: str):
    parser = tool_parser("pock-tune", __doc__)
    if command == "prepare":
        parser.prog = "pock-tune prepare"
        _prepare_options(parser)
        parser.add_argument("--target", default="host", help=target_help())
        parser.add_argument("-o", "--output", required=True, help="the tuning bundle directory to write")
    elif command == "run":
        parser.prog = "pock-tune run"
        parser.add_argument("bundle", help="the tuning bundle (from pock-tune prepare)")
        parser.add_argument("-o", "--output", required=True, help="the table to write (JSON)")
        parser.add_argument("--device", choices=DRIVERS, default=None, help="the IREE driver (default: the target's)")
        parser.add_argument(
            "--benchmark-module",
            default=None,
            help="time with this iree-benchmark-module command (of this IREE version) instead of the Python "
            "runtime, e.g. 'qemu-aarch64 -L /usr/aarch64-linux-gnu .cache/iree-aarch64/VERSION/iree-benchmark-module'; "
            "needs --device-name",
        )
        parser.add_argument("--device-name", default=None, help="with --benchmark-module: the device it runs on")
        _run_options(parser)
    else:  # the usage names the subcommands too: `pock-tune --help` is where a user looks first
        parser.usage = "\n  ".join(line.split("#")[0].strip() for line in __doc__.split("\n\n")[1].splitlines()[:3])
        _prepare_options(parser)
        _run_options(parser)
        parser.add_argument("-o", "--output", required=True, help="the table to write (JSON)")
        parser.add_argument("--bundle", default=None, help="keep the tuning bundle there (default: a temporary one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in ("prepare", "run") else "both"
    args = build_parser(command).parse_args(argv[1:] if command != "both" else argv)
    return run_tool("pock-tune", lambda a: _run(command, a), args, USER_ERRORS, "interrupted; nothing written")


def _prepare(args, target: str, output) -> None:
    from pock_mlir.optim import parse_optimizer
    from pock_mlir.tools.pock_compile import load_model_file
    from pock_mlir.tune import check_tune_destination, prepare

    try:
        optimizer = parse_optimizer(args.optimizer)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--optimizer {args.optimizer}: {e}") from None
    check_tune_destination(output)
    file = load_model_file(args.model)
    sets = args.sets.split(",") if args.sets else None
    prepare(
        file, Path(args.model).name, target, output, optimizer=optimizer, sparse=args.sparse, sets=sets, jobs=args.jobs
    )


def _run(command: str, args) -> int:
    if command == "prepare":
        _prepare(args, args.target, args.output)
    elif command == "run":
        run(
            args.bundle,
            args.output,
            device=args.device,
            repeats=args.repeats,
            steps=args.steps,
            benchmark_module=args.benchmark_module,
            device_name_given=args.device_name,
        )
    else:
        from pock_mlir.files import check_writable

        check_writable(args.output)
        bundle = args.bundle or tempfile.mkdtemp(prefix=".pock-tune-", dir=Path(args.output).resolve().parent)
        try:
            _prepare(args, "host", bundle)
            run(bundle, args.output, repeats=args.repeats, steps=args.steps)
        finally:
            if args.bundle is None:
                shutil.rmtree(bundle, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
