"""pock's MLIR passes (Python), their registry and the pipeline runner."""

from .base import ModulePass, PassError
from .pipeline import PipelineError, run_pipeline
from .registry import PASSES

__all__ = ["ModulePass", "PassError", "PipelineError", "run_pipeline", "PASSES"]
