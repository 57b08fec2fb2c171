"""pock-mlir: compile-time training graphs for sparse on-device fine-tuning.

    import pock_mlir as pock
    program = pock.compile_training(model, x, y, loss="cross_entropy", optimizer=pock.SGD(lr=0.1))
    trainer = program.trainer()
    loss = trainer.step(x, y)
"""

from pock_mlir.compiler import STAGES, CompileError, compile_training
from pock_mlir.frontend import FrontendError
from pock_mlir.optim import SGD, AdamW
from pock_mlir.program import TrainingProgram
from pock_mlir.sparse import SparseConfigError, SparseUpdate

__all__ = ["compile_training", "CompileError", "FrontendError", "SGD", "AdamW", "TrainingProgram",
           "SparseUpdate", "SparseConfigError", "STAGES"]
