"""The supported-ops table, generated from the derivative-rule table so that docs/supported-ops.md cannot drift.

    python -m pock_mlir.tools.ops_table                   # print the Markdown table
    python -m pock_mlir.tools.ops_table --update docs/supported-ops.md  # rewrite it between the page's markers

One row per op with a rule: the op, its family (the rule's module in pock_mlir/autodiff/rules/)
and the first paragraph of the rule's docstring, which names the backward form where it is not
the textbook one.
"""

from __future__ import annotations

import argparse
import sys

import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.files import atomic_write
from pock_mlir.op_facts import derivative_rules

BEGIN, END = "<!-- ops-table:begin -->", "<!-- ops-table:end -->"


def _note(rule) -> str:
    paragraph = (rule.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split()).replace("|", "\\|")


def ops_table() -> str:
    rows = sorted((rule.__module__.rpartition(".")[2], op, _note(rule)) for op, rule in derivative_rules().items())
    lines = ["| op | family | backward |", "| --- | --- | --- |"]
    lines += [f"| `{op}` | {family} | {note} |" for family, op, note in rows]
    return "\n".join(lines) + "\n"


def with_table(text: str, table: str) -> str:
    """`text` with everything between the markers replaced by `table`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no '{BEGIN}' ... '{END}' block")
    return text[: start + len(BEGIN)] + "\n" + table + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pock_mlir.tools.ops_table", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--update", metavar="MARKDOWN", help=f"replace the table between {BEGIN} and {END} in this file"
    )
    args = parser.parse_args(argv)
    table = ops_table()
    if args.update is None:
        sys.stdout.write(table)
        return 0
    with open(args.update) as f:
        text = f.read()
    try:
        updated = with_table(text, table)
    except ValueError as e:
        print(f"{args.update}: {e}", file=sys.stderr)
        return 1
    atomic_write(args.update, updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
