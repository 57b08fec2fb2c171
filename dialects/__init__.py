"""The pock dialect: training-step ops (parameters, loss gradients, optimizer updates)."""

from .pock import Pock, irdl_text, load_pock

__all__ = ["Pock", "load_pock", "irdl_text"]
