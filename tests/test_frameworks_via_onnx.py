"""examples/keras_via_onnx.py and examples/jax_via_onnx.py as docs/onnx.md runs them:
a Keras and a Flax model, converted to ONNX by tf2onnx and jax2onnx, trained by pock-mlir step for
step as by Keras' SGD and optax's AdamW from the same weights on the same batches (the frameworks
are the oracles)."""

import shlex
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import pytest
from docs_blocks import doc_commands

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples import jax_via_onnx, keras_via_onnx  # noqa: E402
from examples.models.via_onnx import by_initializer  # noqa: E402


def documented(script: str) -> list[str]:
    """The arguments the guide gives the script."""
    [command] = [
        shlex.split(c)
        for c in doc_commands("docs/onnx.md", "## Keras and JAX models")
        if shlex.split(c)[1] == f"examples/{script}"
    ]
    return command[2:]


def assert_same_training(argv, result, cwd: Path):
    (their_losses, theirs), (our_losses, ours) = result["framework"], result["pock"]
    assert len(our_losses) == int(argv[argv.index("--steps") + 1])
    assert sorted(ours) == sorted(theirs) and len(theirs) == 4  # two kernels, two biases
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-5)
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    written = onnx.load(cwd / argv[argv.index("--out") + 1])
    assert set(ours) <= {i.name for i in written.graph.initializer}  # --out is the file trained


def test_keras_through_tf2onnx_trains_as_keras_sgd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = documented("keras_via_onnx.py")
    assert_same_training(argv, keras_via_onnx.main(argv), tmp_path)


def test_flax_through_jax2onnx_trains_as_optax_adamw(tmp_path, monkeypatch):
    if not (jax_via_onnx.JAX2ONNX / "jax2onnx").is_dir():
        pytest.fail(f"no jax2onnx in {jax_via_onnx.JAX2ONNX}: {jax_via_onnx.INSTALL.format(jax_via_onnx.JAX2ONNX)}")
    monkeypatch.chdir(tmp_path)
    argv = documented("jax_via_onnx.py")
    assert_same_training(argv, jax_via_onnx.main(argv), tmp_path)


def test_initializers_match_one_weight_each(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])],
        [onnx.numpy_helper.from_array(np.zeros((2, 2), np.float32), "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(onnx.helper.make_model(graph), path)
    zeros = np.zeros((2, 2), np.float32)
    assert by_initializer(path, {"kernel": zeros}) == {"w": "kernel"}
    with pytest.raises(ValueError, match="equals 2 framework weights"):
        by_initializer(path, {"a": zeros, "b": zeros.copy()})
    with pytest.raises(ValueError, match=r"holds \['kernel'\] of the weights"):
        by_initializer(path, {"kernel": zeros, "bias": np.ones(2, np.float32)})
