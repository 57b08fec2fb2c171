"""What a Trainer runs: the compiled modules of a training step, its signature, its target and its
initial parameters, as a compiled TrainingProgram (`program.artifact()`) and a loaded bundle
(`bundle.artifact()`) both give it. The runtime knows no more of the compile side than this type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import iree.runtime as rt
import numpy as np

from pock_mlir.abi import EVALUATE, EVALUATE_TRAIN, GRADIENTS, LOSS, LOSS_TRAIN, TRAIN_STEP_INTO, StepSignature
from pock_mlir.runtime.workspace import transient_bytes
from pock_mlir.targets import Target

# The modules a Trainer compiles, each the first time one of its functions is called: the step
# with the eval-mode forwards, and gradients with the train-mode forwards (which share dispatches
# with its forward) apart: most training never calls them, and gradients repeats the backward.
TRAINER_MODULES = ((TRAIN_STEP_INTO, LOSS, EVALUATE), (GRADIENTS, LOSS_TRAIN, EVALUATE_TRAIN))


def trainer_module(function: str) -> tuple[str, ...]:
    """The functions of the TRAINER_MODULES group that holds `function`."""
    return next(group for group in TRAINER_MODULES if function in group)


@dataclass(frozen=True)
class Schedule:
    """What IREE's schedule of a module (its stream phase) fixes of the memory a Trainer holds."""

    in_place: frozenset[str]  # the roles train_step_into may overwrite where it reads them (empty without it)
    workspace_bytes: int | None  # the largest workspace its functions take (None: compiled without one)


@dataclass(frozen=True)
class CompiledModule:
    vmfb: bytes | Path  # the module, or the file holding it (a bundle's)
    functions: tuple[str, ...]  # what it holds, of pock_mlir.abi's FUNCTIONS
    in_place: frozenset[str]  # the roles train_step_into may overwrite where it reads them (empty without it)

    def load(self, instance: rt.VmInstance) -> rt.VmModule:
        """The module in the VM: a file mapped, where IREE reads it in place (the host holds no copy
        of it), bytes copied into the aligned buffer IREE needs."""
        if isinstance(self.vmfb, Path):
            return rt.VmModule.mmap(instance, str(self.vmfb))
        return rt.VmModule.copy_buffer(instance, self.vmfb)

    @property
    def schedule(self) -> Schedule:
        vm_module = self.load(rt.VmInstance())
        sizes = [size for f in self.functions if (size := transient_bytes(vm_module, f)) is not None]
        return Schedule(self.in_place, max(sizes, default=None))


@dataclass(frozen=True)
class TrainingArtifact:
    signature: StepSignature
    target: Target
    # compiled, by functions: the Trainer loads a function from the module that holds it (a bundle's
    # one module holds every function); modules compiled later are added to this dict
    modules: dict[tuple[str, ...], CompiledModule]
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    # the IREE driver a Trainer runs on unless told otherwise, chosen per program (TrainingProgram.driver)
    driver: str
    # compiles a TRAINER_MODULES group the modules lack, on the first call of one of its functions
    # (None: nothing is left to compile)
    compile: Callable[[tuple[str, ...]], CompiledModule] | None = None
    # the model's Hugging Face files by name (config.json, generation_config.json: the JSON objects),
    # for Trainer.export_pretrained; empty for a model that is not a transformers model
    hf_files: dict[str, dict] = field(default_factory=dict)
