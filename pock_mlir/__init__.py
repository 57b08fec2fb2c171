"""pock-mlir: compile-time training graphs for sparse on-device fine-tuning.

import pock_mlir as pock
program = pock.compile_training(model, x, y, loss="cross_entropy", optimizer=pock.SGD(lr=0.1))
trainer = program.trainer()
loss = trainer.step(x, y)
"""

import importlib

# Imported on first use: the compiler needs PyTorch and torch-mlir, while pock_mlir.runtime and
# pock-train run bundles on devices that have neither.
_EXPORTS = {
    "compile_training": "pock_mlir.compiler",
    "CompileError": "pock_mlir.compiler",
    "STAGES": "pock_mlir.stages",
    "FrontendError": "pock_mlir.frontend",
    "WeightsError": "pock_mlir.weights",
    "SGD": "pock_mlir.optim",
    "AdamW": "pock_mlir.optim",
    "OrtAdamW": "pock_mlir.optim",
    "TrainingProgram": "pock_mlir.program",
    "SparseUpdate": "pock_mlir.sparse",
    "SparseConfigError": "pock_mlir.sparse",
    "Budget": "pock_mlir.search",
    "search_sparse": "pock_mlir.search",
    "SearchError": "pock_mlir.search",
    "from_ort_recipe": "pock_mlir.ort_recipe",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pock_mlir' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__():
    return sorted(list(globals()) + __all__)
