"""A Keras model fine-tuned by pock-mlir through ONNX, step for step against Keras' own training.

    python examples/keras_via_onnx.py --steps 5 --out keras_mlp.onnx

A Keras Sequential CNN (Conv2D, Dense) is converted by tf2onnx, pock-mlir compiles a training step of the .onnx
file (cross-entropy, SGD with momentum), and the same Keras model trains with keras.optimizers.SGD
on the same batches; both losses are printed for each step, and the largest difference of the
trained weights. Needs the `frameworks` extra (tensorflow-cpu, tf2onnx): docs/onnx.md, "Keras and JAX models".
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

BATCH, IMAGE, CLASSES = 16, (6, 6, 2), 3  # IMAGE: height, width, channels (Keras' layout)
LR, MOMENTUM = 0.1, 0.9
OPSET = 17


def keras_model():
    import keras

    keras.utils.set_random_seed(0)
    # Non-zero biases: TensorFlow's graph optimizer, which tf2onnx runs, drops the addition of a
    # zero constant, so a layer's zero-initialized bias would not reach the .onnx file.
    biases = {"bias_initializer": keras.initializers.RandomNormal(stddev=0.1)}
    return keras.Sequential(
        [
            keras.Input(IMAGE),
            keras.layers.Conv2D(4, 3, activation="relu", **biases),
            keras.layers.Flatten(),
            keras.layers.Dense(CLASSES, **biases),
        ]
    )


def weights(model) -> dict[str, np.ndarray]:
    """The trainable weights as the .onnx file holds them: tf2onnx writes a Conv2D kernel (height,
    width, in, out) in ONNX's layout (out, in, height, width)."""
    return {
        v.path: np.array(v.numpy() if v.ndim != 4 else v.numpy().transpose(3, 2, 0, 1))
        for v in model.trainable_variables
    }


def keras_side(directory: Path, steps: int) -> None:
    """The child process: the model to DIRECTORY/model.onnx, then Keras' own training loop."""
    import keras
    import tensorflow as tf
    import tf2onnx

    model = keras_model()
    # tf2onnx's from_keras does not take Keras 3 models; a tf.function of the call is the same graph.
    call = tf.function(lambda x: model(x, training=False))
    # A dynamic batch axis, as models are usually exported: pock-mlir compiles for the batch's shape.
    signature = (tf.TensorSpec((None, *IMAGE), tf.float32, name="x"),)
    tf2onnx.convert.from_function(call, input_signature=signature, opset=OPSET, output_path=str(directory / MODEL))
    names = by_initializer(directory / MODEL, weights(model))

    batches = make_batches(steps, (BATCH, *IMAGE), CLASSES)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(learning_rate=LR, momentum=MOMENTUM)
    losses = []
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        losses.append(float(loss))
    save_reference(directory, batches, losses, weights(model), names)


def main(argv=None) -> dict | None:
    parser = argument_parser(__doc__)
    args = parse_args(parser, argv)
    if args.framework_side is not None:
        return keras_side(args.framework_side, args.steps)
    if importlib.util.find_spec("tf2onnx") is None:
        parser.error("tf2onnx is not installed: pip install -e '.[frameworks]' (docs/onnx.md)")
    import pock_mlir as pock

    # pock-mlir's SGD is torch.optim's (b = m*b + g; w -= lr*b): Keras' steps (v = m*v - lr*g;
    # w += v) at a constant learning rate.
    optimizer = pock.SGD(lr=LR, momentum=MOMENTUM)
    return compare("Keras", __file__, args, optimizer, {"TF_CPP_MIN_LOG_LEVEL": "2"})


if __name__ == "__main__":
    main()
