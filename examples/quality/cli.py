"""The command-line options the quality scripts share."""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).parent / "results"  # what the README quotes (tools/readme_results.py)
QUICK_OUT = "quality_quick"


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help=f"a much shorter run, for a smoke test (written to {QUICK_OUT}/ unless --out says otherwise)")
    parser.add_argument("--out", help=f"where to write the results (default {RESULTS.relative_to(RESULTS.parents[2])}, "
                                      "which the README quotes)")


def output_directory(parser: argparse.ArgumentParser, args) -> Path:
    """--out, defaulted; a quick run never overwrites the results the README quotes."""
    out = Path(args.out or (QUICK_OUT if args.quick else RESULTS))
    if args.quick and out.resolve() == RESULTS.resolve():
        parser.error(f"--quick would overwrite the results the README quotes in {RESULTS}: give another --out")
    return out
