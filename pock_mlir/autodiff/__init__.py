"""Compile-time reverse-mode autodiff over torch-dialect IR."""

from .reverse import MissingRuleError, differentiate
from .rules import defrule

__all__ = ["MissingRuleError", "differentiate", "defrule"]
