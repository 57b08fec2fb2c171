"""Derivative rules, one small vector-Jacobian product per torch-dialect op, by family.

Importing this package registers every rule in RULES.
"""

from . import activations, conv, core, losses, transformer  # noqa: F401  (registers rules)
from .base import RULES, defrule, unreduce

__all__ = ["RULES", "defrule", "unreduce"]
