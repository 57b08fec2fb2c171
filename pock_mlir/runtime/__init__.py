"""Running compiled training programs on the IREE runtime."""

from .trainer import InputError, ModuleError, NonFiniteLossError, Trainer

__all__ = ["InputError", "ModuleError", "NonFiniteLossError", "Trainer"]
