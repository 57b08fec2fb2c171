"""What every pock pass is: a frozen dataclass whose fields are its command-line options."""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir


class PassError(Exception):
    """A pass cannot transform the IR; reported as an MLIR error at `location`."""

    def __init__(self, message: str, location: ir.Location | None = None):
        super().__init__(message)
        self.location = location


@dataclass(frozen=True)
class ModulePass:
    name: ClassVar[str]
    description: ClassVar[str]

    def apply(self, module: ir.Operation) -> object | None:
        """Transform `module` in place; a pass that decides something returns its decisions typed,
        which run_pipeline hands to its caller (pock-backend-switch: its BackendChoices)."""
        raise NotImplementedError

    @classmethod
    def options(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def option_help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in cls.options()}


def option(default, help: str):
    """A pass option: a default and a one-line help text for --list-passes."""
    return dataclasses.field(default=default, metadata={"help": help})


def functions(module: ir.Operation):
    """The func.func ops of a module."""
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "func.func":
            yield op


def function_named(module: ir.Operation, name: str):
    """The module's func.func called `name`."""
    return next(f for f in functions(module) if ir.StringAttr(f.attributes["sym_name"]).value == name)
