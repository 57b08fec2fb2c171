"""ExecuTorch's on-device training (its training extension) as a bench peer, in its own process.
`python -m bench.executorch_child '<json spec>'` loads the program.pte that bench/child.py's
"executorch-export" task wrote (the model and its loss, forward and backward, as one method) and
speaks the protocol of bench/child.py; a step runs the method and ExecuTorch's C++ SGD on the same
batch as the other systems. Its warm-up steps are checked first: their losses must equal eager
PyTorch's on the same training (written by the export), or the row fails instead of being timed.

ExecuTorch's Python runtime links libtorch and imports torch and executorch.exir as it loads, so
unlike ONNX Runtime's and JAX's children this one has torch loaded; its peak memory is over the
resident set after those imports, as bench/child.py's is over torch's.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
from pathlib import Path

import numpy as np

from bench.memory import rss_kb
from bench.protocol import print_result, timed_rounds, torch_loaded

LOSS_TOLERANCE = 1e-4  # relative: float32 kernels that sum in another order, over a few steps
FQN_METHOD = "__et_training_fqn_forward"  # the names of the trained parameters, in the outputs' order


def runtime():
    """torch, ExecuTorch's module loader and its SGD (the pybindings need torch loaded first)."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch, _unsafe_reset_threadpool
    from executorch.extension.training import get_sgd_optimizer

    return torch, _load_for_executorch, _unsafe_reset_threadpool, get_sgd_optimizer


def run_executorch(spec, torch, load, reset_threadpool, get_sgd_optimizer) -> dict:
    directory = Path(spec["artifacts"])
    training = json.loads((directory / "training.json").read_text())
    with np.load(directory / "batch.npz") as saved:
        batch = tuple(torch.from_numpy(saved[f"arr_{i}"]) for i in range(len(saved.files)))
    torch.set_num_threads(spec["threads"])
    reset_threadpool(spec["threads"])  # ExecuTorch's optimized kernels' own pool
    module = load(str(directory / "program.pte"))
    names = module.run_method(FQN_METHOD, ())
    trained = len(names)
    sgd = training["optimizer"]
    state = {}

    def step():
        # The method returns the loss, the gradients and the parameters, in FQN_METHOD's order.
        # TrainingModule slices them at indices that count the batch norms' updated buffers, which
        # are no outputs here: it would pair gradients with the wrong parameters, so they are
        # sliced here. Not cloned: the parameters are the program's own (SGD updates them in
        # place) and the gradients are read before the next run overwrites them.
        outputs = module.run_method("forward", batch, clone_outputs=False)
        if len(outputs) != 1 + 2 * trained:
            raise RuntimeError(
                f"the program returned {len(outputs)} values, not a loss and {trained} gradients and parameters"
            )
        if "optimizer" not in state:
            state["parameters"] = dict(zip(names, outputs[1 + trained :]))
            state["optimizer"] = get_sgd_optimizer(
                state["parameters"], sgd["lr"], sgd["momentum"], sgd["dampening"], sgd["weight_decay"], sgd["nesterov"]
            )
        loss = outputs[0].item()
        state["optimizer"].step(dict(zip(names, outputs[1 : 1 + trained])))
        return loss

    expected = training["eager_losses"]
    losses = [step() for _ in expected]
    differ = [
        f"step {i + 1}: {got:.6g} against {want:.6g}"
        for i, (got, want) in enumerate(zip(losses, expected))
        if not math.isclose(got, want, rel_tol=LOSS_TOLERANCE)
    ]
    if differ:
        raise RuntimeError(f"its losses differ from eager PyTorch's on the same training: {'; '.join(differ)}")
    result = timed_rounds(step, {**spec, "warmup": max(spec["warmup"] - len(expected), 0)})
    return {
        **result,
        "trainable_params": sum(p.numel() for p in state["parameters"].values()),
        "torch_loaded": torch_loaded(),
        "executorch": importlib.metadata.version("executorch"),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    loaded = runtime()
    print_result(lambda: run_executorch(spec, *loaded), rss_kb())


if __name__ == "__main__":
    main()
