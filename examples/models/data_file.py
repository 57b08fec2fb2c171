"""The command line every example model file shares: `python examples/NAME.py DATA.npz` writes
the file's data in pock-train's layout; --help shows the file's docstring (its commands)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

from pock_mlir.files import atomic_save


def write_data_main(doc: str, load_data: Callable[[], dict[str, np.ndarray]], argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python {sys.argv[0]}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("output", metavar="DATA.npz", help="where to write the data (pock-train --data reads it)")
    args = parser.parse_args(argv)
    if not args.output.endswith(".npz"):
        parser.error(f"{args.output}: the data file must end in .npz (numpy.savez adds it otherwise)")
    atomic_save(args.output, lambda f: np.savez(f, **load_data()))
    print(f"wrote {args.output}")
