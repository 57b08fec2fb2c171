"""The command-line options the quality scripts share."""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).parent / "results"  # what the README quotes (tools/readme_results.py)
QUICK_OUT = "quality_quick"


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help=f"a much shorter run of a few of the schemes, for a smoke test (written to {QUICK_OUT}/ unless --out says otherwise)")
    parser.add_argument("--out", help=f"where to write the results (default {RESULTS.relative_to(RESULTS.parents[2])}, "
                                      "which the README quotes)")


def output_directory(parser: argparse.ArgumentParser, args) -> Path:
    """--out, defaulted; a quick run never overwrites the results the README quotes."""
    out = Path(args.out or (QUICK_OUT if args.quick else RESULTS))
    if args.quick and out.resolve() == RESULTS.resolve():
        parser.error(f"--quick would overwrite the results the README quotes in {RESULTS}: give another --out")
    return out


def add_search_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--search", metavar="MB,...", help="also train the schemes pock.search_sparse finds under these "
                                                           "device-memory budgets (MB, as Trainer.device_bytes counts it)")


def search_budgets(parser: argparse.ArgumentParser, args) -> list[float]:
    """--search's budgets, in MB."""
    try:
        return [float(mb) for mb in args.search.split(",")] if args.search else []
    except ValueError:
        parser.error(f"--search {args.search}: give budgets in MB separated by commas, e.g. 4,8")


def searched_schemes(out: Path, task: str, budgets: list[float]) -> dict[str, str]:
    """The searched schemes' names and the files they are written to, one per budget."""
    return {f"searched ({mb:g} MB)": str(out / f"{task}_search_{mb:g}MB.yaml") for mb in budgets}
