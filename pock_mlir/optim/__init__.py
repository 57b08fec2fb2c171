"""Optimizers as compile-time descriptions, one file each (sgd.py, adamw.py, ort_adamw.py): the hyperparameters
and their checks, the pock update op each emits per parameter, its state slots and its lowering,
registered in registry.py, which the passes ask. Their state (momentum buffers, Adam moments)
lives next to the parameters in the runtime and is threaded through the train step; `step`
counts the steps taken so far. Adding one: docs/adding-an-optimizer.md."""

from .sgd import SGD  # noqa: I001  (registration order: the order --list-passes shows)
from .adamw import AdamW
from .ort_adamw import OrtAdamW
from .registry import OPTIMIZERS, UPDATE_OPS, UpdateOp, parse_optimizer

__all__ = ["SGD", "AdamW", "OrtAdamW", "parse_optimizer", "OPTIMIZERS", "UPDATE_OPS", "UpdateOp"]
