"""Derivative rules, one small vector-Jacobian product per torch-dialect op, by family.

Importing this package registers every rule (with the op's other facts) in pock_mlir.op_facts.FACTS.
"""

from . import activations, conv, core, losses, quantized, transformer  # noqa: F401  (registers rules)
from .base import defrule, unreduce

__all__ = ["defrule", "unreduce"]
