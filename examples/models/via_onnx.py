"""What examples/keras_via_onnx.py and examples/jax_via_onnx.py share.

Each example's framework side (building the model, converting it to ONNX, the framework's own
training) runs in a child process that never imports pock-mlir's compile side: TensorFlow and
jaxlib each carry a copy of LLVM, and in one process with torch-mlir's and IREE's, LLVM's option
registry aborts ("LLVM ERROR: inconsistency in registered CommandLine options"). The child writes
model.onnx and reference.npz (the batches, the framework's losses and trained weights by the
file's initializer names); the parent trains the file with pock-mlir on the same batches."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pock_mlir.files import OutputError, atomic_write, check_writable

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


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """The options both examples take: --steps, --out, and the child's --framework-side."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--out", help="also write the converted model here (a .onnx file)")
    parser.add_argument("--framework-side", metavar="DIR", type=Path, help=argparse.SUPPRESS)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """`parser`'s arguments, --steps and (in the parent) --out checked."""
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: give at least 1")
    if args.framework_side is None and args.out is not None:
        if not args.out.endswith(".onnx"):
            parser.error(f"--out {args.out}: the converted model's file name must end in .onnx")
        try:
            check_writable(args.out)
        except OutputError as e:
            parser.error(str(e))
    return args


def compare(framework: str, script, args: argparse.Namespace, optimizer, env: dict) -> dict:
    """The framework's (`script`'s child, run with `env`) and pock-mlir's training from the same
    weights on the same batches, printed: {"framework": (losses, weights), "pock": (losses,
    weights)}, weights by initializer name; the converted file to args.out if given."""
    with tempfile.TemporaryDirectory() as directory:
        ref = framework_side(script, args.steps, directory, env)
        ours = pock_training(Path(directory) / MODEL, ref["batches"], optimizer)
        if args.out is not None:
            atomic_write(args.out, (Path(directory) / MODEL).read_bytes())
    result = {"framework": (ref["losses"], ref["weights"]), "pock": ours}
    report(framework, result)
    return result


def report(framework: str, result: dict) -> None:
    for i, (a, b) in enumerate(zip(result["framework"][0], result["pock"][0])):
        print(f"step {i + 1}: loss {framework} {a:.6f}  pock-mlir {b:.6f}")
    theirs, ours = result["framework"][1], result["pock"][1]
    error = max(float(np.abs(theirs[n] - ours[n]).max()) for n in theirs)
    print(f"largest weight difference after {len(result['pock'][0])} steps: {error:.2e}")
