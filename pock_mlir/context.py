"""The one MLIR context setup every pock tool and pass uses: torch-mlir's bindings with the
torch dialect registered and the pock dialect loaded."""

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect

import pock_mlir.optim  # noqa: F401  (registers the checks the pock update ops' verifiers call)
from pock_mlir.dialects import load_pock


def make_context() -> ir.Context:
    context = ir.Context()
    torch_dialect.register_dialect(context)
    load_pock(context)
    return context
