"""A Flax (JAX) model fine-tuned by pock-mlir through ONNX, step for step against optax.

    python examples/jax_via_onnx.py --steps 5 --out flax_mlp.onnx

A Flax NNX MLP is converted by jax2onnx, pock-mlir compiles a training step of the .onnx file
(cross-entropy, AdamW), and the same Flax model trains with optax.adamw on the same batches; both
losses are printed for each step, and the largest difference of the trained weights. Needs the
`frameworks` extra and jax2onnx in its own directory (--jax2onnx; default the venv's jax2onnx/):
docs/onnx.md, "Keras and JAX models".
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.via_onnx import (  # noqa: E402
    MODEL,
    argument_parser,
    by_initializer,
    compare,
    make_batches,
    parse_args,
    save_reference,
)

BATCH, FEATURES, CLASSES = 16, 8, 3
LR, WEIGHT_DECAY = 0.01, 0.01
OPSET = 21  # the newest that the venv's onnx 1.16.2 (pock-mlir's shape inference) knows
JAX2ONNX = Path(sys.prefix) / "jax2onnx"
INSTALL = "pip install --no-deps --target {} -r examples/jax2onnx-requirements.txt"


def flax_model():
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(FEATURES, 32, rngs=rngs)
            self.out = nnx.Linear(32, CLASSES, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    return MLP(nnx.Rngs(0))


def jax_side(directory: Path, steps: int) -> None:
    """The child process: the model to DIRECTORY/model.onnx, then optax's training."""
    import jax
    import optax
    from flax import nnx
    from jax2onnx import to_onnx

    model = flax_model()
    to_onnx(model, [(BATCH, FEATURES)], return_mode="file", output_path=str(directory / MODEL), opset=OPSET)
    graph, params = nnx.split(model, nnx.Param)

    def flat(tree) -> dict[str, np.ndarray]:
        return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}

    names = by_initializer(directory / MODEL, flat(params))

    def loss_fn(params, x, y):
        logits = nnx.merge(graph, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    # optax.adamw decays the weights as torch.optim.AdamW does (w -= lr * (adam + wd * w)).
    optimizer = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    state = optimizer.init(params)
    batches, losses = make_batches(steps, (BATCH, FEATURES), CLASSES), []
    for x, y in batches:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    save_reference(directory, batches, losses, flat(params), names)


def main(argv=None) -> dict | None:
    parser = argument_parser(__doc__)
    parser.add_argument("--jax2onnx", type=Path, default=JAX2ONNX, help=f"jax2onnx's directory (default {JAX2ONNX})")
    args = parse_args(parser, argv)
    if args.framework_side is not None:
        return jax_side(args.framework_side, args.steps)
    if importlib.util.find_spec("flax") is None or importlib.util.find_spec("optax") is None:
        parser.error("flax and optax are not installed: pip install -e '.[frameworks]' (docs/onnx.md)")
    if not (args.jax2onnx / "jax2onnx").is_dir():
        parser.error(f"no jax2onnx in {args.jax2onnx}: {INSTALL.format(args.jax2onnx)}")
    import pock_mlir as pock

    # jax2onnx's directory first: its onnx shadows the venv's in this one child only.
    env = {"PYTHONPATH": str(args.jax2onnx), "JAX_PLATFORMS": "cpu"}
    return compare("optax", __file__, args, pock.AdamW(lr=LR, weight_decay=WEIGHT_DECAY), env)


if __name__ == "__main__":
    main()
