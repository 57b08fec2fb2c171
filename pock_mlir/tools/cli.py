"""What the command-line tools share: the layout of their --help and how an error ends them."""

from __future__ import annotations

import argparse
import os
import sys


def tool_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A parser whose --help is the tool's docstring: its first paragraph above the options, the
    rest but the usage paragraph below."""
    return argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def run_tool(prog: str, run, args, errors: tuple[type[BaseException], ...], interrupted: str | None = None) -> int:
    """run(args); an error of `errors` is one line on stderr and exit code 1 (POCK_DEBUG=1 raises it
    instead), Ctrl-C the line `interrupted` and exit code 130 (None: the tool handles Ctrl-C itself)."""
    try:
        return run(args)
    except KeyboardInterrupt:
        if interrupted is None:
            raise
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    except errors as e:
        if os.environ.get("POCK_DEBUG"):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
