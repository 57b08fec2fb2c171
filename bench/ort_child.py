"""ONNX Runtime on-device training (onnxruntime.training.api) in a process that never imports torch:
torch's OpenMP threads and memory would be measured with it. `python -m bench.ort_child '<json spec>'`
takes the artifacts and batch.npz that bench/child.py's "ort-export" task wrote and speaks the
protocol of bench/child.py; each step is train_step, optimizer step, lazy_reset_grad on the same
batch as the other systems. Peak memory is over the resident set after importing numpy and
onnxruntime.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np

from bench.memory import rss_kb
from bench.protocol import block_torch, print_result, timed_rounds, torch_loaded


def training_api():
    """onnxruntime.training.api without torch. The package's __init__ imports ORTModule and torch
    optimizers, which the on-device API does not use; so onnxruntime.training is loaded as a bare
    package, and `import torch` fails (onnxruntime's own import then goes on without ORTModule)."""
    block_torch()
    import onnxruntime

    package = types.ModuleType("onnxruntime.training")
    package.__path__ = [str(Path(onnxruntime.__file__).parent / "training")]
    sys.modules["onnxruntime.training"] = package
    from onnxruntime.training import api

    return onnxruntime, api


def run_ort(spec, onnxruntime, api) -> dict:
    directory = Path(spec["artifacts"])
    with np.load(directory / "batch.npz") as saved:
        batch = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = spec["threads"]
    module = api.Module(
        directory / "training_model.onnx",
        api.CheckpointState.load_checkpoint(directory / "checkpoint"),
        session_options=options,
    )
    optimizer = api.Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(spec["learning_rate"])
    module.train()

    def step():
        loss = module(*batch)
        optimizer.step()
        module.lazy_reset_grad()
        return float(loss)

    result = timed_rounds(step, spec)
    return {
        **result,
        "trainable_params": module.get_parameters_size(trainable_only=True),
        "torch_loaded": torch_loaded(),
        "onnxruntime": onnxruntime.__version__,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    onnxruntime, api = training_api()
    print_result(lambda: run_ort(spec, onnxruntime, api), rss_kb())


if __name__ == "__main__":
    main()
