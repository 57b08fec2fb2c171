"""The command-line options the quality scripts share."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).parent / "results"  # what docs/quality.md quotes (tools/readme_results.py)
QUICK_OUT = "quality_quick"
REFERENCE = "pytorch full (reference)"  # the row every task compares its schemes with


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a much shorter run of a few of the schemes, for a smoke test (written to {QUICK_OUT}/ unless --out says otherwise)",
    )
    parser.add_argument(
        "--out",
        help=f"where to write the results (default {RESULTS.relative_to(RESULTS.parents[2])}, which docs/quality.md quotes)",
    )


def parse(parser: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, list[float] | str, Path]:
    """Add the options every quality script takes (--quick, --out, --seed, --search) to `parser`
    and parse `argv`: the arguments, the search budgets (search_budgets) and the output directory,
    created (output_directory)."""
    add_output_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    add_search_option(parser)
    args = parser.parse_args(argv)
    budgets = search_budgets(parser, args)
    out = output_directory(parser, args)
    out.mkdir(parents=True, exist_ok=True)
    return args, budgets, out


def samples(batches) -> tuple:
    """Batches of (inputs, target) as one array of samples each (what pock.search_sparse takes)."""
    import numpy as np

    return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])


def output_directory(parser: argparse.ArgumentParser, args) -> Path:
    """--out, defaulted; a quick run never overwrites the results docs/quality.md quotes."""
    out = Path(args.out or (QUICK_OUT if args.quick else RESULTS))
    if args.quick and out.resolve() == RESULTS.resolve():
        parser.error(f"--quick would overwrite the results docs/quality.md quotes in {RESULTS}: give another --out")
    return out


PRESETS = "presets"  # --search presets: one budget per hand-written scheme the task searches against
QUICK_SEARCH = {"steps": 3, "ratios": (1.0,)}  # --quick searches whole tensors only, for 3 steps each


def add_search_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--search",
        metavar="presets|MB,...",
        help="also train the schemes pock.search_sparse finds under these device-memory budgets (MB, as "
        "Trainer.device_bytes counts it), or, with 'presets', at the memory each hand-written "
        "preset measured",
    )


def search_budgets(parser: argparse.ArgumentParser, args) -> list[float] | str:
    """--search's budgets in MB, or PRESETS."""
    if args.search == PRESETS:
        return PRESETS
    try:
        budgets = [float(mb) for mb in args.search.split(",")] if args.search else []
    except ValueError:
        budgets = [0.0]
    if not all(mb > 0 for mb in budgets):
        parser.error(f"--search {args.search}: give '{PRESETS}' or budgets in MB separated by commas, e.g. 4,8")
    return budgets


@dataclass(frozen=True)
class Searched:
    """A searched scheme: its row's name, its budget, the file the search writes, the
    hand-written scheme whose memory set the budget (None for a budget given in MB), and the
    storage of its frozen layer weights (search_sparse's quantize)."""

    name: str
    mb: float
    file: str
    against: str | None = None
    quantize: str | None = None


def searched_schemes(
    out: Path, task: str, budgets: dict[float, str | None], quantized: dict[str, str] | None = None
) -> list[Searched]:
    """One per budget: {MB: the scheme it was measured from, or None}; a scheme in `quantized`
    ({name: "int8"}) is over an int8 frozen base, and so is the search at its memory."""
    searched = []
    for mb, against in budgets.items():
        quantize = (quantized or {}).get(against)
        over = f" over {quantize}" if quantize else ""
        searched.append(
            Searched(
                f"searched{over} ({mb:.2f} MB" + (f", {against}'s memory)" if against else ")"),
                mb,
                str(out / f"{task}_search_{mb:.2f}MB{'_' + quantize if quantize else ''}.yaml"),
                against,
                quantize,
            )
        )
    return searched


def searched_against(name: str) -> str | None:
    """The hand-written scheme whose memory a searched row's name (searched_schemes) says it was
    searched at; None for any other row."""
    found = re.fullmatch(r"searched(?: over \S+)? \(\d+\.\d\d MB, (?P<against>.*)'s memory\)", name)
    return found.group("against") if found else None


def searches(searched: list[Searched]) -> dict[str | None, list[Searched]]:
    """The searched schemes by the storage of their frozen weights: one search_sparse call each."""
    groups: dict[str | None, list[Searched]] = {}
    for s in searched:
        groups.setdefault(s.quantize, []).append(s)
    return groups


def write_searched(searched: list[Searched], results) -> None:
    """Write each budget's scheme (search_sparse's results, in the order of `searched`) and print its table."""
    for s, result in zip(searched, results):
        result.write(s.file)
        print(f"{s.name}: {s.file}\n{result.table()}", flush=True)


def in_table_order(results: dict, searched: list[Searched], prefix: str = "") -> dict:
    """`results` with each searched row right after the row of the scheme it searched against."""
    after = {prefix + s.against: prefix + s.name for s in searched if s.against}
    ordered = {}
    for name, result in results.items():
        if name in after.values():
            continue
        ordered[name] = result
        if name in after and after[name] in results:
            ordered[after[name]] = results[after[name]]
    return {**ordered, **{n: r for n, r in results.items() if n not in ordered}}
