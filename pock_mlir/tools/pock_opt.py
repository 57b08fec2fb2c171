"""pock-opt: parse pock + torch + upstream IR, run a pipeline of pock and MLIR passes, print.

Errors come out as `FILE:LINE:COL: error: MESSAGE` with exit code 1, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from torch_mlir import ir

from pock_mlir.context import make_context
from pock_mlir.files import atomic_write, check_writable
from pock_mlir.passes import PASSES, PipelineError, run_pipeline
from pock_mlir.passes.pipeline import build_pass_manager
from pock_mlir.report import ReportError, module_reports

SPLIT_MARKER = "// -----"
_LOCATION = re.compile(r'"(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)')
_EXPECTED = re.compile(
    r"//\s*expected-(?P<kind>error|warning|remark|note)\s*(?:@(?P<offset>[+-]\d+))?\s*\{\{(?P<text>.*)\}\}"
)
_REGEX_PART = re.compile(r"\{\{(.*?)\}\}")


@dataclass
class Diagnostic:
    line: int
    col: int
    severity: str
    message: str


def split_chunks(text: str, split: bool) -> list[str]:
    """The input, or each '// -----' chunk of it with blank lines in place of the lines before
    it, so that every location MLIR reports (also inside pass messages) is a line of the file."""
    if not split:
        return [text]
    chunks, current, start = [], [], 0
    for number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == SPLIT_MARKER:
            chunks.append("\n" * start + "".join(current))
            current, start = [], number + 1
        else:
            current.append(line)
    chunks.append("\n" * start + "".join(current))
    return chunks


def _severity(diag) -> str:
    return str(diag.severity).rsplit(".", 1)[-1].lower()


def _collect(diags) -> list[Diagnostic]:
    found = []
    for d in diags:
        m = _LOCATION.search(str(d.location))
        diagnostic = Diagnostic(int(m["line"]) if m else 0, int(m["col"]) if m else 0, _severity(d), str(d.message))
        if diagnostic not in found:  # MLIR can report a verifier error twice (parse and verify)
            found.append(diagnostic)
    return found


def _mlir_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse(chunk: str, source_name: str) -> ir.Module:
    """The chunk as a module whose locations name `source_name` (the input file, or <stdin>), so
    that messages quoting a location (pock-autodiff's "at FILE:LINE") name it for stdin and split
    chunks too. ir.Module.parse takes no source name and calls every input "-", and
    ir.Operation.parse, which takes one, refuses several top-level ops: so the module is printed
    with its locations, renamed, and parsed again."""
    located = ir.Module.parse(chunk).operation.get_asm(enable_debug_info=True)
    return ir.Module.parse(located.replace('loc("-":', f"loc({_mlir_string(source_name)}:"))


MAX_NESTING = 500  # deeper input would overflow the MLIR parser's stack (a crash, not an error)
_OPENERS, _CLOSERS = "{([<", "})]>"
_CUSTOM_POCK_OP = re.compile(r"(?:^|=)\s*pock\.\w+")


def nesting_depth(text: str) -> tuple[int, int]:
    """(deepest bracket nesting, the line where it is reached), outside string literals and
    comments; `->` is an arrow, not a closing bracket."""
    depth, deepest, deepest_line, line = 0, 0, 1, 1
    in_string = in_comment = escaped = False
    previous = ""
    for ch in text:
        if ch == "\n":
            line, in_comment = line + 1, False
        elif in_comment:
            pass
        elif in_string:
            in_string = escaped or ch != '"'
            escaped = ch == "\\" and not escaped
        elif ch == '"':
            in_string, escaped = True, False
        elif ch == "/" and previous == "/":
            in_comment = True
        elif ch in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest, deepest_line = depth, line
        elif ch in _CLOSERS and not (ch == ">" and previous == "-"):
            depth = max(depth - 1, 0)
        previous = ch
    return deepest, deepest_line


def _unparsable(chunk: str) -> list[Diagnostic]:
    """What to say when MLIR rejects the input without a diagnostic (an IRDL op in custom syntax)."""
    for number, line in enumerate(chunk.splitlines(), 1):
        if _CUSTOM_POCK_OP.search(line.split("//")[0]):
            return [
                Diagnostic(
                    number,
                    1,
                    "error",
                    "pock ops have no custom syntax; write them in generic form, e.g. "
                    '%y = "pock.param"(%x) {...} : (T) -> T',
                )
            ]
    return [Diagnostic(1, 1, "error", "MLIR cannot parse this input (it gave no detail)")]


def process(
    chunk: str, pipeline: str, print_ir_after_all: bool, source_name: str, pock_report: bool = False
) -> tuple[str | None, list[Diagnostic]]:
    """Parse and transform one chunk; returns (output IR, or the report, or None; diagnostics)."""
    depth, line = nesting_depth(chunk)
    if depth > MAX_NESTING:
        return None, [
            Diagnostic(line, 1, "error", f"brackets nest {depth} deep here, more than pock-opt reads ({MAX_NESTING})")
        ]
    context = make_context()
    with context:
        try:
            module = parse(chunk, source_name)
            if pipeline:
                run_pipeline(module, pipeline, print_ir_after_all=print_ir_after_all)
            if pock_report:  # the report differentiates the module again: with its locations, its errors
                reports = module_reports(module.operation.get_asm(enable_debug_info=True))  # name the input's lines
                return "\n\n".join(map(str, reports)) + "\n", []
        except ir.MLIRError as e:
            return None, _collect(e.error_diagnostics) or _unparsable(chunk)
        return str(module), []


def expected_diagnostics(chunk: str) -> list[Diagnostic]:
    expected = []
    for number, line in enumerate(chunk.splitlines(), 1):
        for m in _EXPECTED.finditer(line):
            expected.append(Diagnostic(number + int(m["offset"] or 0), 0, m["kind"], m["text"]))
    return expected


def expected_pattern(text: str) -> re.Pattern:
    """MLIR's expected-* text: a substring of the message, with `{{regex}}` for the parts that vary."""
    parts = _REGEX_PART.split(text)  # literal text at even positions, regexes at odd ones
    return re.compile("".join(part if i % 2 else re.escape(part) for i, part in enumerate(parts)))


def verify(chunk: str, produced: list[Diagnostic], filename: str) -> list[str]:
    """Compare produced diagnostics with the chunk's expected-* annotations."""
    problems, remaining = [], list(produced)
    for want in expected_diagnostics(chunk):
        match = next(
            (
                d
                for d in remaining
                if d.line == want.line
                and d.severity == want.severity
                and expected_pattern(want.message).search(d.message)
            ),
            None,
        )
        if match is None:
            problems.append(f'{filename}:{want.line}: expected {want.severity} "{want.message}" was not produced')
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
    parser.add_argument(
        "-p",
        "--pass-pipeline",
        default="",
        help="comma-separated passes, options in braces: 'pock-autodiff,canonicalize,pock-x{opt=1}'",
    )
    parser.add_argument(
        "--split-input-file", action="store_true", help=f"process each '{SPLIT_MARKER}' chunk separately"
    )
    parser.add_argument(
        "--verify-diagnostics",
        action="store_true",
        help="check errors against '// expected-error [@+N] {{text}}' annotations ({{regex}} inside text)",
    )
    parser.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    parser.add_argument("--list-passes", action="store_true", help="list pock passes with their options")
    parser.add_argument("--emit-irdl", action="store_true", help="print the pock dialect as IRDL (for --irdl-file)")
    parser.add_argument(
        "--pock-report",
        action="store_true",
        help="print the sparse-backpropagation report of the (training-stage) result instead of its IR",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (PipelineError, ReportError, InputError) as e:
        print(f"pock-opt: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"pock-opt: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug in pock itself still reaches the user as one line
        if os.environ.get("POCK_DEBUG"):
            raise
        print(
            f"pock-opt: internal error (a bug in pock-mlir: please report it with this input): {type(e).__name__}: "
            f"{e} (POCK_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _write(text: str, output: str) -> None:
    """stdout, or the file replaced atomically: it is written only when the run succeeded."""
    if output == "-":
        sys.stdout.write(text)
    else:
        atomic_write(output, text)


class InputError(ValueError):
    pass


def _read(path: str) -> str:
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{'<stdin>' if path == '-' else path}: not UTF-8 text (byte {e.start}); pock-opt reads MLIR assembly"
        ) from None


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
    if args.output != "-":
        check_writable(args.output)
    text = _read(args.input)
    outputs, failed = [], False
    for chunk in split_chunks(text, args.split_input_file):
        result, diags = process(chunk, args.pass_pipeline, args.mlir_print_ir_after_all, filename, args.pock_report)
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
    if failed and args.output != "-":
        return 1  # -o FILE keeps what it held
    _write(f"\n{SPLIT_MARKER}\n".join(outputs), args.output)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
