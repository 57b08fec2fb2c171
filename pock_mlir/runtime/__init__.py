"""Running compiled training programs on the IREE runtime."""

from .trainer import Trainer

__all__ = ["Trainer"]
