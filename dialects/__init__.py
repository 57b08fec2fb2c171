"""The pock dialect: training-step ops (parameters, loss gradients, optimizer updates)."""

from .pock import Pock, load_pock, irdl_text

__all__ = ["Pock", "load_pock", "irdl_text"]
