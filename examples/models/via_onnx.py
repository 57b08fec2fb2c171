"""What examples/keras_via_onnx.py and examples/jax_via_onnx.py share.

Each example's framework side (building the model, converting it to ONNX, the framework's own
training) runs in a child process that never imports pock-mlir's compile side: TensorFlow and
jaxlib each carry a copy of LLVM, and in one process with torch-mlir's and IREE's, LLVM's option
registry aborts ("LLVM ERROR: inconsistency in registered CommandLine options"). The child writes
model.onnx and reference.npz (the batches, the framework's losses and trained weights by the
file's initializer names); the parent trains the file with pock-mlir on the same batches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

MODEL, REFERENCE = "model.onnx", "reference.npz"


def make_batches(steps: int, shape: tuple[int, ...], classes: int, seed: int = 0) -> list:
    """`steps` batches of random inputs of `shape` and class labels."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape, dtype=np.float32), rng.integers(0, classes, shape[0])) for _ in range(steps)]


def by_initializer(onnx_path, weights: dict[str, np.ndarray]) -> dict[str, str]:
    """{initializer: framework weight name}: each float initializer of the file is the one framework
    weight of its shape and values (converters rename weights, and their order is theirs)."""
    import onnx
    import onnx.numpy_helper

    names = {}
    for init in onnx.load(str(onnx_path)).graph.initializer:
        value = onnx.numpy_helper.to_array(init)
        if value.dtype != np.float32 or value.ndim == 0:
            continue  # not a parameter to pock-mlir's ONNX frontend: shapes, scalars
        same = [n for n, w in weights.items() if w.shape == value.shape and np.array_equal(w, value)]
        if len(same) != 1:
            raise ValueError(f"initializer {init.name!r} {value.shape} equals {len(same)} framework weights, not one")
        names[init.name] = same[0]
    if sorted(names.values()) != sorted(weights):
        raise ValueError(f"the .onnx file holds {sorted(names.values())} of the weights {sorted(weights)}")
    return names


def save_reference(directory, batches, losses, trained: dict[str, np.ndarray], names: dict[str, str]) -> None:
    """The child's reference.npz: trained weights under the initializer names (`names`)."""
    arrays = {f"x{i}": x for i, (x, _) in enumerate(batches)} | {f"y{i}": y for i, (_, y) in enumerate(batches)}
    arrays |= {"losses": np.asarray(losses, np.float64)} | {f"w:{i}": trained[n] for i, n in names.items()}
    np.savez(Path(directory) / REFERENCE, **arrays)


def framework_side(script, steps: int, directory, env: dict | None = None) -> dict:
    """Run `script --framework-side DIRECTORY` in a child; its batches, losses and trained weights."""
    command = [sys.executable, str(script), "--framework-side", str(directory), "--steps", str(steps)]
    done = subprocess.run(command, env=dict(os.environ, **(env or {})), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the framework side failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    with np.load(Path(directory) / REFERENCE) as ref:
        return {
            "batches": [(ref[f"x{i}"], ref[f"y{i}"]) for i in range(steps)],
            "losses": [float(v) for v in ref["losses"]],
            "weights": {k[2:]: ref[k] for k in ref.files if k.startswith("w:")},
        }


def pock_training(onnx_path, batches: list, optimizer) -> tuple[list[float], dict[str, np.ndarray]]:
    """The losses of pock-mlir's compiled steps on the batches, and the file's trained initializers."""
    import pock_mlir as pock

    x, y = batches[0]
    trainer = pock.compile_training(str(onnx_path), x, y, loss="cross_entropy", optimizer=optimizer).trainer()
    losses = [trainer.step(x, y) for x, y in batches]
    return losses, trainer.state_dict()


def report(framework: str, result: dict) -> None:
    for i, (a, b) in enumerate(zip(result["framework"][0], result["pock"][0])):
        print(f"step {i + 1}: loss {framework} {a:.6f}  pock-mlir {b:.6f}")
    theirs, ours = result["framework"][1], result["pock"][1]
    error = max(float(np.abs(theirs[n] - ours[n]).max()) for n in theirs)
    print(f"largest weight difference after {len(result['pock'][0])} steps: {error:.2e}")
