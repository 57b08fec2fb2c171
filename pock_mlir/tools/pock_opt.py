"""pock-opt: parse pock + torch + upstream IR, run a pipeline of pock and MLIR passes, print.

Errors come out as `FILE:LINE:COL: error: MESSAGE` with exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.context import make_context
from pock_mlir.passes import PASSES, PipelineError, run_pipeline
from pock_mlir.passes.pipeline import build_pass_manager

SPLIT_MARKER = "// -----"
_LOCATION = re.compile(r'"(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)')
_EXPECTED = re.compile(r"//\s*expected-(?P<kind>error|warning|remark|note)\s*(?:@(?P<offset>[+-]\d+))?\s*\{\{(?P<text>.*?)\}\}")


@dataclass
class Diagnostic:
    line: int
    col: int
    severity: str
    message: str


@dataclass
class Chunk:
    text: str
    first_line: int  # 1-based line of the chunk's first line in the input file


def split_chunks(text: str, split: bool) -> list[Chunk]:
    if not split:
        return [Chunk(text, 1)]
    chunks, current, start = [], [], 1
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if line.strip() == SPLIT_MARKER:
            chunks.append(Chunk("".join(current), start))
            current, start = [], number + 1
        else:
            current.append(line)
    chunks.append(Chunk("".join(current), start))
    return chunks


def _severity(diag) -> str:
    return str(diag.severity).rsplit(".", 1)[-1].lower()


def _collect(diags, chunk: Chunk) -> list[Diagnostic]:
    found = []
    for d in diags:
        m = _LOCATION.search(str(d.location))
        line = int(m["line"]) + chunk.first_line - 1 if m else 0
        col = int(m["col"]) if m else 0
        diagnostic = Diagnostic(line, col, _severity(d), str(d.message))
        if diagnostic not in found:  # MLIR can report a verifier error twice (parse and verify)
            found.append(diagnostic)
    return found


def process(chunk: Chunk, pipeline: str, print_ir_after_all: bool) -> tuple[str | None, list[Diagnostic]]:
    """Parse and transform one chunk; returns (output IR or None, diagnostics)."""
    context = make_context()
    with context:
        try:
            module = ir.Module.parse(chunk.text)
            if pipeline:
                run_pipeline(module, pipeline, print_ir_after_all=print_ir_after_all)
        except ir.MLIRError as e:
            return None, _collect(e.error_diagnostics, chunk)
        return str(module), []


def expected_diagnostics(chunk: Chunk) -> list[Diagnostic]:
    expected = []
    for number, line in enumerate(chunk.text.splitlines(), chunk.first_line):
        for m in _EXPECTED.finditer(line):
            expected.append(Diagnostic(number + int(m["offset"] or 0), 0, m["kind"], m["text"]))
    return expected


def verify(chunk: Chunk, produced: list[Diagnostic], filename: str) -> list[str]:
    """Compare produced diagnostics with the chunk's expected-* annotations."""
    problems, remaining = [], list(produced)
    for want in expected_diagnostics(chunk):
        match = next((d for d in remaining if d.line == want.line and d.severity == want.severity
                      and want.message in d.message), None)
        if match is None:
            problems.append(f"{filename}:{want.line}: expected {want.severity} \"{want.message}\" was not produced")
        else:
            remaining.remove(match)
    for d in remaining:
        if d.severity == "error":
            problems.append(f"{filename}:{d.line}:{d.col}: unexpected error: {d.message}")
    return problems


def list_passes() -> str:
    lines = ["pock passes (combine them with any upstream MLIR pass, e.g. canonicalize, cse, inline):"]
    for name in sorted(PASSES):
        cls = PASSES[name]
        lines.append(f"  {name}: {cls.description}")
        for option, help_text in cls.option_help().items():
            default = next(f.default for f in cls.options() if f.name == option)
            lines.append(f"      {option}={default!r}: {help_text}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pock-opt", description=__doc__.splitlines()[0])
    parser.add_argument("input", nargs="?", default="-", help="input .mlir file, or - for stdin (default)")
    parser.add_argument("-o", "--output", default="-", help="write the result here instead of stdout")
    parser.add_argument("-p", "--pass-pipeline", default="",
                        help="comma-separated passes, options in braces: 'pock-autodiff,canonicalize,pock-x{opt=1}'")
    parser.add_argument("--split-input-file", action="store_true", help=f"process each '{SPLIT_MARKER}' chunk separately")
    parser.add_argument("--verify-diagnostics", action="store_true",
                        help="check errors against '// expected-error [@+N] {{text}}' annotations")
    parser.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    parser.add_argument("--list-passes", action="store_true", help="list pock passes with their options")
    parser.add_argument("--emit-irdl", action="store_true", help="print the pock dialect as IRDL (for --irdl-file)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except PipelineError as e:
        print(f"pock-opt: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"pock-opt: error: {e}", file=sys.stderr)
        return 1


def _write(text: str, output: str) -> None:
    if output == "-":
        sys.stdout.write(text)
    else:
        with open(output, "w") as f:
            f.write(text)


def _run(args) -> int:
    if args.list_passes:
        print(list_passes())
        return 0
    if args.emit_irdl:
        from pock_mlir.dialects import irdl_text

        _write(irdl_text(), args.output)
        return 0
    if args.pass_pipeline:
        with make_context():  # report a bad pipeline before reading any input
            build_pass_manager(args.pass_pipeline)
    filename = "<stdin>" if args.input == "-" else args.input
    text = sys.stdin.read() if args.input == "-" else open(args.input).read()
    outputs, failed = [], False
    for chunk in split_chunks(text, args.split_input_file):
        result, diags = process(chunk, args.pass_pipeline, args.mlir_print_ir_after_all)
        if args.verify_diagnostics:
            problems = verify(chunk, diags, filename)
            for p in problems:
                print(p, file=sys.stderr)
            failed |= bool(problems)
        else:
            for d in diags:
                print(f"{filename}:{d.line}:{d.col}: {d.severity}: {d.message}", file=sys.stderr)
            failed |= result is None
        if result is not None:
            outputs.append(result)
    _write(f"\n{SPLIT_MARKER}\n".join(outputs), args.output)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
