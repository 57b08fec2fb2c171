"""Parsing and running pipelines that mix pock's Python passes with upstream MLIR passes.

A Python pass cannot be named inside a textual MLIR pipeline, so a pipeline string such as
`pock-autodiff,canonicalize,func.func(cse),pock-lower-optimizers{x=1}` is split at its
top-level commas here: pock passes are added to the PassManager as Python callables, every
other element is handed to MLIR's own pipeline parser. All run in one PassManager.
"""

import dataclasses
import difflib
import os
import re
import traceback
import typing

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from .base import ModulePass, PassError
from .registry import PASSES


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or option, or has a bad option value."""


def split_top_level(text: str, separator: str = ",") -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
        if depth < 0:
            break
        if ch == separator and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise PipelineError(f"unbalanced brackets in pipeline '{text}'")
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return [p for p in parts if p]


def _convert(pass_cls, field: dataclasses.Field, raw: str):
    hints = typing.get_type_hints(pass_cls)
    kind = hints[field.name]
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return raw.lower() in ("true", "1")
        return kind(raw)
    except ValueError:
        raise PipelineError(
            f"option '{field.name}' of pass '{pass_cls.name}' takes a {kind.__name__}, got '{raw}'"
        ) from None


def parse_pock_pass(element: str) -> ModulePass:
    """`pock-x{a=1 b=two}` -> an instance of the registered pass class."""
    name, _, rest = element.partition("{")
    pass_cls = PASSES[name.strip()]
    options_text = rest.rstrip("}").strip() if rest else ""
    fields = {f.name: f for f in pass_cls.options()}
    values = {}
    for item in options_text.split():
        key, eq, raw = item.partition("=")
        if key not in fields:
            valid = ", ".join(fields) or "none"
            raise PipelineError(f"pass '{pass_cls.name}' has no option '{key}'; its options: {valid}")
        if not eq:
            raise PipelineError(f"option '{key}' of pass '{pass_cls.name}' needs a value: {key}=...")
        values[key] = _convert(pass_cls, fields[key], raw)
    return pass_cls(**values)


def _python_pass(instance: ModulePass, results: list):
    def run(op, pass_):
        try:
            with ir.Location.unknown(op.context):  # builders need a default location
                result = instance.apply(op)
            if result is not None:
                results.append(result)
        except PassError as e:
            (e.location or op.location).emit_error(f"{instance.name}: {e}")
            pass_.signal_pass_failure()
        except Exception as e:  # an internal error still reaches the user as a diagnostic
            detail = traceback.format_exc() if os.environ.get("POCK_DEBUG") else f"{type(e).__name__}: {e}"
            op.location.emit_error(
                f"{instance.name}: internal error (a bug in pock-mlir: please report it with this "
                f"input; POCK_DEBUG=1 shows the traceback): {detail}"
            )
            pass_.signal_pass_failure()

    run.__name__ = instance.name.replace("-", "_")
    return run


def build_pass_manager(pipeline: str, *, print_ir_after_all: bool = False, results: list | None = None) -> PassManager:
    """The PassManager of `pipeline`; each pock pass that returns a result adds it to `results`."""
    results = [] if results is None else results
    pm = PassManager("builtin.module")
    for element in split_top_level(pipeline):
        name = element.split("{")[0].split("(")[0].strip()
        if name in PASSES:
            if "(" in element.split("{")[0]:
                raise PipelineError(
                    f"pock pass '{name}' runs on the whole module and takes no nested pipeline: '{element}'"
                )
            instance = parse_pock_pass(element)
            pm.add(
                _python_pass(instance, results),
                name=instance.name,
                argument=instance.name,
                description=instance.description,
            )
            continue
        try:
            pm.add(element)
        except ValueError as e:
            nested = [p for p in PASSES if re.search(rf"[(,]\s*{re.escape(p)}\b", element)]
            if nested:
                raise PipelineError(
                    f"pock passes run on the whole module, so '{nested[0]}' cannot be nested in "
                    f"'{element}'; list it at the top level of the pipeline"
                ) from None
            first_line = str(e).strip().splitlines()[0]
            close = difflib.get_close_matches(name, PASSES, n=1)
            did_you_mean = f"Did you mean '{close[0]}'? " if close else ""
            raise PipelineError(
                f"unknown pass or bad options in '{element}' ({first_line}).\n{did_you_mean}"
                f"pock passes: {', '.join(sorted(PASSES))}; any upstream MLIR pass is accepted too "
                f"(canonicalize, cse, inline, symbol-dce, ...). `pock-opt --list-passes` describes them."
            ) from None
    if print_ir_after_all:
        pm.enable_ir_printing(print_after_all=True, print_module_scope=True)
    return pm


def run_pipeline(module: ir.Module, pipeline: str, *, print_ir_after_all: bool = False) -> list:
    """Run a pipeline on a module in place; returns the results its pock passes returned, in the
    order they ran (see ModulePass.apply). Raises ir.MLIRError with the diagnostics on failure."""
    results = []
    build_pass_manager(pipeline, print_ir_after_all=print_ir_after_all, results=results).run(module.operation)
    return results
