"""Copy the result tables the scripts write into README.md, so that its numbers are never typed by hand.

    python tools/readme_results.py           # rewrite README.md's result blocks from the files
    python tools/readme_results.py --check   # exit 1 (naming the stale blocks) when they differ

A block is the text between `<!-- results: PATH -->` and `<!-- results:end -->`; it holds the
Markdown file PATH (relative to the repository) with its headings demoted two levels, so that
they sit under the README section that quotes them. bench/ writes bench/results.md,
examples/quality/ writes examples/quality/results/{vision,vision_seeds,language,text,federated}.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pock_mlir.files import atomic_write

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- results:end -->)", re.S)


def quoted(path: str) -> str:
    source = ROOT / path
    if not source.is_file():
        raise SystemExit(f"README.md quotes {path}, which does not exist: run the script that writes it")
    text = re.sub(r"^(#+) ", lambda m: "#" * min(len(m.group(1)) + 2, 6) + " ", source.read_text(), flags=re.M)
    return text.rstrip("\n") + "\n"


def refreshed(readme: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + quoted(m.group("path")) + m.group(4), readme)


def stale_blocks(readme: str) -> list[str]:
    return [m.group("path") for m in BLOCK.finditer(readme) if m.group("body") != quoted(m.group("path"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    text = readme.read_text()
    if args.check:
        stale = stale_blocks(text)
        for path in stale:
            print(f"{readme}: the block quoting {path} is stale: run python tools/readme_results.py", file=sys.stderr)
        return 1 if stale else 0
    atomic_write(readme, refreshed(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
