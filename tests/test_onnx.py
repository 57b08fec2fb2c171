"""ONNX models in: files torch.onnx.export writes train as the PyTorch models they came from
(oracle: torch.autograd and torch.optim on that model), the tuned model goes back into the .onnx
file (oracle: ONNX Runtime's inference on it), and ONNX Runtime's training recipe trains alike in
onnxruntime-training 1.19.2 and in pock-mlir."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from docs_blocks import doc_commands, doc_python
from oracle import assert_close_to_norm, assert_trajectory_close, torch_gradients
from safetensors.numpy import load_file

import pock_mlir as pock
from pock_mlir.frontend import FrontendError

B = 4


def perturbed(model: nn.Module, seed: int) -> nn.Module:
    """The model with every parameter and buffer moved off its initial value: torch's exporter
    stores equal initializers once (a fresh norm's weight of ones and its running variance), which
    ties them in the file."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_buffers():
            if name.endswith("running_var"):
                t.uniform_(0.5, 2.0, generator=g)
            elif name.endswith("running_mean"):
                t.uniform_(-0.5, 0.5, generator=g)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def exported(model: nn.Module, x: torch.Tensor, dynamic_batch: bool = False, **options) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            f,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}} if dynamic_batch else None,
            **options,
        )
    return onnx.load_from_string(f.getvalue())


class Encoder(nn.Module):
    """A BERT-style encoder layer on token ids, mean-pooled into a classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.head = nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.layer(self.embed(ids)).mean(1))


def mlp():
    torch.manual_seed(0)
    return perturbed(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)), 1)


def cnn():
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return perturbed(nn.Sequential(*layers, nn.Linear(4, 3)), 2)


def encoder():
    torch.manual_seed(0)
    return perturbed(Encoder(), 3)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(4)
    return torch.randn(B, 6, generator=g), torch.randint(0, 3, (B,), generator=g)


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory, batch):
    model, path = mlp(), tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    onnx.save(exported(model, batch[0], dynamic_batch=True), path)
    return model, path


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """docs/onnx.md's Python block, run as written in a directory of its own: its names, and the
    directory, which holds the model.onnx and tuned.onnx it wrote."""
    directory = tmp_path_factory.mktemp("guide")
    here = os.getcwd()
    os.chdir(directory)
    try:
        names: dict = {}
        exec(doc_python("docs/onnx.md", "## In Python"), names)
    finally:
        os.chdir(here)
    return names, directory


def test_guide_trains_the_file_as_its_pytorch_model(guide):
    """The file's initializers are the parameters under their names, a sparse scheme freezes by
    name, and the steps follow torch.optim on the model the file was exported from."""
    names, _ = guide
    model, x, y, trainer = names["model"], names["x"], names["y"], names["trainer"]
    assert [p.name for p in trainer.signature.params] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert trainer.signature.trainable == ["0.weight", "2.weight", "2.bias"]
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    trainable = set(trainer.signature.trainable)
    assert_trajectory_close(names["losses"], trainer.state_dict(), model, x, y, optimizer, 5, trainable=trainable)


def test_export_onnx_gives_onnx_runtime_the_tuned_model(guide):
    import onnxruntime

    names, directory = guide
    model, x, trainer = names["model"], names["x"], names["trainer"]
    session = onnxruntime.InferenceSession(str(directory / "tuned.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], trainer.evaluate(x), rtol=1e-5, atol=1e-6)
    # the source's dynamic batch axis is kept: ONNX Runtime runs the tuned file on any batch
    assert session.run(None, {"x": np.zeros((3, 6), np.float32)})[0].shape == (3, 3)
    tuned = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(directory / "tuned.onnx").graph.initializer}
    np.testing.assert_array_equal(tuned["0.bias"], model[0].bias.detach().numpy())  # frozen by the scheme
    np.testing.assert_array_equal(tuned["2.weight"], trainer.state_dict()["2.weight"])
    assert not np.array_equal(tuned["2.weight"], model[2].weight.detach().numpy())


def test_export_onnx_refuses_another_model(guide, tmp_path):
    from pock_mlir.runtime.onnx_export import OnnxExportError

    names, _ = guide
    other = exported(nn.Sequential(nn.Linear(6, 2)), names["x"])
    with pytest.raises(OnnxExportError, match="no initializer 2.bias, 2.weight: give the .onnx model"):
        names["trainer"].export_onnx(tmp_path / "out.onnx", other)
    assert not (tmp_path / "out.onnx").exists()


def test_guide_command_line_block(guide):
    """docs/onnx.md's commands on the model.onnx its Python block wrote."""
    _, directory = guide
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for command in doc_commands("docs/onnx.md", "## From the command line"):
        done = subprocess.run(
            ["bash", "-c", command], cwd=directory, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{command}\n{done.stderr[-2000:]}"
    assert "trained 16 steps in all" in done.stdout
    tuned = load_file(directory / "onnx-bundle" / "tuned.safetensors")
    assert sorted(tuned) == ["0.bias", "0.weight", "2.bias", "2.weight"]


@pytest.mark.parametrize("make", [cnn, encoder], ids=["conv-bn-relu", "encoder"])
def test_exported_models_have_autograd_gradients(make):
    """Conv-BatchNorm(inference)-ReLU and an attention encoder (MatMul, Softmax,
    LayerNormalization, Gelu, Expand and shape arithmetic folded for the batch)."""
    model = make()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 8, 8, generator=g) if make is cnn else torch.randint(0, 11, (2, 5), generator=g)
    y = torch.tensor([0, 2])
    program = pock.compile_training(exported(model, x, do_constant_folding=False), x, y, functions=("gradients",))
    state = dict(model.named_parameters())
    assert [p.name for p in program.signature.params] == list(state)
    trainer = program.trainer()
    if make is cnn:
        assert [b.name for b in program.signature.buffers] == ["1.running_mean", "1.running_var"]
    else:  # ids the embedding has no row for are refused on the host, before the device reads them
        assert program.signature.vocabularies == {"input0": 11}
        with pytest.raises(ValueError, match="input0"):
            trainer.gradients(torch.full_like(x, 11), y)
    loss, grads = trainer.gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)


def test_bad_onnx_inputs_get_one_line(mlp_file, batch, tmp_path):
    _, path = mlp_file
    x, y = batch
    cases = [
        (tmp_path / "missing.onnx", x, "no such ONNX file"),
        (path, torch.randn(B, 5), r"input 'x' has shape \(4, 5\); the ONNX graph takes \(batch, 6\)"),
        (path, (x, x), "2 inputs given; the ONNX graph takes 1: x"),
        (path, {"ids": x}, "keyword input\\(s\\) ids: the ONNX graph's inputs are x"),
        (path, x.double(), "input 'x' is float64; the ONNX graph takes float32"),
    ]
    for model, inputs, message in cases:
        with pytest.raises(FrontendError, match=message) as caught:
            pock.compile_training(model, inputs, y)
        assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"LoRA policies add adapters to the PyTorch model.*\(an ONNX model"):
        pock.compile_training(path, x, y, sparse={"0": "lora"})
    with pytest.raises(ValueError, match="int8 weights need the PyTorch model"):
        pock.compile_training(
            path, x, y, sparse={"default": "full", "0.bias": "frozen", "quantize": {"frozen": "int8"}}
        )
    with pytest.raises(ValueError, match="weights=: an ONNX model holds its weights as initializers"):
        pock.compile_training(path, x, y, weights=tmp_path)


def test_an_op_torch_mlir_cannot_lower_is_named_by_its_node(batch):
    x, y = batch
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
            onnx.helper.make_node("Unknown", ["h"], ["y"], name="mystery", domain="example.custom"),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [B, 6])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [B, 3])],
        [onnx.numpy_helper.from_array(np.ones((6, 3), np.float32), "w")],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("example.custom", 1)]
    )
    with pytest.raises(FrontendError, match="mystery") as caught:
        pock.compile_training(model, x, y)
    assert "\n" not in str(caught.value)


ORT_STEPS = 4
# loss, optimizer, requires_grad; frozen_params (the rest stays a graph constant there). BCE and L1
# are callable losses, traced alone on the output's shape; CrossEntropyLoss with AdamW is the
# migration guide's block (test_migration_guide_trains_as_onnx_runtime_training).
ORT_RECIPES = {
    "mse-sgd": ("MSELoss", "SGD", ["0.weight", "0.bias", "2.weight", "2.bias"], []),
    "l1-sgd": ("L1Loss", "SGD", ["2.weight", "2.bias"], []),
    "bce_with_logits-adamw": ("BCEWithLogitsLoss", "AdamW", ["0.weight", "2.weight"], ["0.bias"]),
}


def ort_training(model_proto, recipe, x, y, lr, directory):
    """(losses, final parameters) of ONNX Runtime training: generate_artifacts, then the
    train_step, Optimizer.step, lazy_reset_grad loop of its on-device API."""
    from onnxruntime.training import api, artifacts

    loss, optimizer, requires_grad, frozen = recipe
    artifacts.generate_artifacts(
        model_proto,
        requires_grad=requires_grad,
        frozen_params=frozen,
        loss=artifacts.LossType[loss],
        optimizer=artifacts.OptimType[optimizer],
        artifact_directory=directory,
    )
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state)
    ort_optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
    ort_optimizer.set_learning_rate(lr)
    module.train()
    losses = []
    for _ in range(ORT_STEPS):
        losses.append(float(module(x.numpy(), y.numpy())))
        ort_optimizer.step()
        module.lazy_reset_grad()
    return losses, {name: state.parameters[name].data for name in requires_grad + frozen}


@pytest.mark.parametrize("recipe", list(ORT_RECIPES))
def test_ort_recipe_trains_as_onnx_runtime_training(recipe, batch, tmp_path):
    """The same .onnx trained by onnxruntime-training 1.19.2 and by pock.from_ort_recipe with the
    same arguments: the same losses and weights (float32 rounding apart)."""
    x, labels = batch
    loss, optimizer, requires_grad, frozen = ORT_RECIPES[recipe]
    y = labels if loss == "CrossEntropyLoss" else torch.rand(B, 3, generator=torch.Generator().manual_seed(7))
    proto = exported(mlp(), x, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    want_losses, want = ort_training(proto, ORT_RECIPES[recipe], x, y, 0.05, tmp_path)
    program = pock.from_ort_recipe(
        proto, x, y, requires_grad=requires_grad, frozen_params=frozen, loss=loss, optimizer=optimizer, lr=0.05
    )
    assert program.signature.trainable == [p.name for p in program.signature.params if p.name in requires_grad]
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(ORT_STEPS)]
    np.testing.assert_allclose(losses, want_losses, rtol=2e-6)
    assert losses[-1] < losses[0]
    state = trainer.state_dict()
    for name, value in want.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_ort_recipe_refuses_what_generate_artifacts_refuses(mlp_file, batch):
    _, path = mlp_file
    x, y = batch
    cases = [
        (dict(requires_grad=["0.weight"], frozen_params=["0.weight"]), "cannot be frozen and require gradient"),
        (dict(requires_grad=["0.wieght"]), "0.wieght: no initializer of the ONNX model has this name"),
        (dict(requires_grad=[]), "requires_grad names no initializer: there is nothing to train"),
        (dict(requires_grad=["0.weight"], loss="HingeLoss"), "loss='HingeLoss': ONNX Runtime's are CrossEntropyLoss"),
        (dict(requires_grad=["0.weight"], optimizer="Adam"), "optimizer='Adam': ONNX Runtime's are AdamW, SGD"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            pock.from_ort_recipe(path, x, y, **options)


def test_pock_compile_errors_are_one_line(tmp_path, mlp_file, capsys):
    from pock_mlir.tools.pock_compile import main

    _, path = mlp_file
    for argv, message in [
        ([str(path)], "input 'x' has shape batchx6 in the file; give its size: --input-shape x=Nx6"),
        ([str(path), "--input-shape", "x=8"], "input 'x' has shape (8,); the ONNX graph takes (batch, 6)"),
        ([str(path), "--input-shape", "ids=8x6"], "--input-shape ids: the ONNX graph's inputs are x"),
        ([str(path), "--input-shape", "x=8xsix"], "--input-shape x=8xsix: give NAME=DIMS"),
    ]:
        assert main([*argv, "-o", str(tmp_path / "bundle")]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bundle").exists()


def test_migration_guide_trains_as_onnx_runtime_training(tmp_path, monkeypatch):
    """docs/coming-from-onnx-runtime.md's block against ONNX Runtime training on its model.onnx."""
    import onnxruntime

    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(doc_python("docs/coming-from-onnx-runtime.md", "## The recipe, moved"), names)
    x, y, trainer = names["x"], names["y"], names["trainer"]
    recipe = ("CrossEntropyLoss", "AdamW", ["0.bias", "2.weight", "2.bias"], ["0.weight"])
    (tmp_path / "ort").mkdir()
    want_losses, want = ort_training(onnx.load("model.onnx"), recipe, x, y, 0.05, tmp_path / "ort")
    np.testing.assert_allclose(names["losses"], want_losses, rtol=2e-6)
    state = trainer.state_dict()
    for name, value in want.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    session = onnxruntime.InferenceSession("inference.onnx", providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], trainer.evaluate(x), rtol=1e-5, atol=1e-6)


def test_training_mode_batch_norm_updates_its_statistics_as_onnx_runtime_does(tmp_path):
    """A file exported in training mode: BatchNormalization normalizes by the batch's statistics
    (the steps follow torch.optim) and updates its running statistics as ONNX Runtime computes
    them (ONNX's biased batch variance; PyTorch's running_var is unbiased); evaluate runs the
    eval-mode graph on them."""
    import onnxruntime

    model = cnn().train()
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.tensor([0, 2, 1, 0])
    proto = exported(model, x, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    program = pock.compile_training(proto, x, y, optimizer=pock.SGD(lr=0.1))
    assert program.signature.updated_buffers == ["1.running_mean", "1.running_var"]
    trainer = program.trainer()
    with_statistics = onnx.ModelProto()
    with_statistics.CopyFrom(proto)
    (norm,) = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    with_statistics.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v) for v in norm.output[1:3])
    session = onnxruntime.InferenceSession(with_statistics.SerializeToString(), providers=["CPUExecutionProvider"])
    _, mean, var = session.run(None, {"x": x.numpy()})
    reference = copy.deepcopy(model)  # the exporter's trace ran it: its statistics are the file's
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        want = F.cross_entropy(reference(x), y)
        want.backward()
        optimizer.step()
        assert trainer.step(x, y) == pytest.approx(want.item(), rel=1e-5)
        if step == 0:
            state = trainer.state_dict()
            np.testing.assert_allclose(state["1.running_mean"], mean, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(state["1.running_var"], var, rtol=1e-5, atol=1e-7)
    state = trainer.state_dict()
    for name, value in reference.named_parameters():
        assert_close_to_norm(state[name], value.detach().numpy(), 1e-5, name)
    from pock_mlir.onnx_frontend import in_eval_mode

    trainer.export_onnx(tmp_path / "eval.onnx", in_eval_mode(proto))
    session = onnxruntime.InferenceSession(str(tmp_path / "eval.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], trainer.evaluate(x), rtol=1e-5, atol=1e-6)


def test_training_mode_dropout_draws_the_pytorch_paths_masks(batch, tmp_path):
    """A file exported in training mode with two Dropouts: its steps follow torch.optim on the
    source module run inside SeededDropout with the Trainer's seeds (the PyTorch path's masks);
    evaluate runs the eval-mode graph, as ONNX Runtime does on it."""
    import onnxruntime

    x, y = batch
    torch.manual_seed(0)
    layers = [nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 3)]
    model = perturbed(nn.Sequential(*layers), 9).train()
    proto = exported(model, x, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    assert [n.op_type for n in proto.graph.node].count("Dropout") == 2
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    program = pock.compile_training(proto, x, y, optimizer=optimizer, functions=("step", "evaluate"))
    assert [(s.name, s.dtype) for s in program.signature.inputs] == [("input0", "float32"), ("seed", "int32")]
    trainer = program.trainer()
    trainer.seed = 5
    losses = [trainer.step(x, y) for _ in range(3)]
    assert_trajectory_close(losses, trainer.state_dict(), model, x, y, optimizer, 3, seed=5)
    from pock_mlir.onnx_frontend import in_eval_mode

    trainer.export_onnx(tmp_path / "eval.onnx", in_eval_mode(proto))
    session = onnxruntime.InferenceSession(str(tmp_path / "eval.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], trainer.evaluate(x), rtol=1e-5, atol=1e-6)


def test_dropout_with_a_computed_ratio_is_refused_by_its_node(batch):
    x, y = batch
    ratio = onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [])
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
            onnx.helper.make_node("Dropout", ["h", "p", "on"], ["y"], name="drop"),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [B, 6]), ratio],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [B, 3])],
        [
            onnx.numpy_helper.from_array(np.ones((6, 3), np.float32), "w"),
            onnx.numpy_helper.from_array(np.array(True), "on"),
        ],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match="ONNX node 'drop' is a Dropout whose ratio is computed") as caught:
        pock.compile_training(model, (x, torch.tensor(0.5)), y)
    assert "\n" not in str(caught.value)


# -- files of both torch.onnx exporters, from library models --------------------------------------

ONNXSCRIPT = Path(sys.prefix) / "onnxscript"  # tests/onnxscript-requirements.txt, installed apart
ONNXSCRIPT_INSTALL = f"pip install --no-deps --target {ONNXSCRIPT} -r tests/onnxscript-requirements.txt"


class Logits(nn.Module):
    """A Hugging Face classifier on token ids, returning its logits tensor (exporters take tensors out)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def zoo_cnn():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.MobileNetV2(
        num_classes=3, width_mult=0.5, inverted_residual_setting=[[1, 8, 1, 1], [6, 16, 1, 2]]
    )
    return perturbed(model, 10), torch.randn(2, 3, 16, 16), torch.tensor([1, 2])


def zoo_vit():
    import timm

    torch.manual_seed(0)
    model = timm.models.VisionTransformer(
        img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2, num_classes=3
    )
    return perturbed(model, 11), torch.randn(2, 3, 16, 16), torch.tensor([0, 2])


def zoo_bert():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=31,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = Logits(transformers.BertForSequenceClassification(config))
    # no id 0: it is BERT's padding_idx, whose row PyTorch's embedding never updates, and ONNX's
    # Gather, which the file holds instead, knows no padding row (docs/onnx.md)
    return perturbed(model, 12), torch.randint(1, 31, (2, 6)), torch.tensor([2, 1])


ZOO = {"mobilenet_v2": zoo_cnn, "vit": zoo_vit, "bert": zoo_bert}
EXPORTERS = ("torchscript", "dynamo")


@pytest.fixture(scope="module")
def zoo_files(tmp_path_factory):
    """{(family, exporter): (model, x, y, ModelProto)}: each model exported in eval mode by the
    TorchScript exporter (without constant folding, which merges layers) and by the dynamo exporter
    (in one child process: tests/onnx_dynamo_export.py says why)."""
    directory = tmp_path_factory.mktemp("zoo")
    files, children = {}, []
    for family, make in ZOO.items():
        model, x, y = make()
        files[family, "torchscript"] = (model, x, y, exported(model, x, do_constant_folding=False))
        torch.export.save(torch.export.export(model, (x,)), directory / f"{family}.pt2")
        children += [str(directory / f"{family}.pt2"), str(directory / f"{family}.onnx")]
    if not (ONNXSCRIPT / "onnxscript").is_dir():
        pytest.fail(f"the dynamo exporter's onnxscript is not in {ONNXSCRIPT}: {ONNXSCRIPT_INSTALL} (make does it)")
    child = Path(__file__).parent / "onnx_dynamo_export.py"
    env = dict(os.environ, PYTHONPATH=str(ONNXSCRIPT))
    done = subprocess.run([sys.executable, child, *children], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for family in ZOO:
        model, x, y, _ = files[family, "torchscript"]
        files[family, "dynamo"] = (model, x, y, onnx.load(directory / f"{family}.onnx"))
    return files


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", list(ZOO))
def test_exporters_files_of_library_models_train_as_the_pytorch_model(zoo_files, family, exporter, tmp_path):
    """A torchvision MobileNetV2, a timm ViT and a Hugging Face BERT classifier, each exported by
    both exporters: 3 steps from the file follow torch.optim on the source module, and the tuned
    file in ONNX Runtime gives the compiled evaluate's outputs."""
    import onnxruntime

    model, x, y, proto = zoo_files[family, exporter]
    optimizer = pock.SGD(lr=0.05, momentum=0.9)
    program = pock.compile_training(proto, x, y, optimizer=optimizer, functions=("step", "evaluate"))
    assert [p.name for p in program.signature.params] == [n for n, _ in model.named_parameters()]
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(3)]
    constants = {n: t.numpy() for n, t in model.state_dict().items() if not t.is_floating_point()}  # the file's too
    assert_trajectory_close(losses, {**trainer.state_dict(), **constants}, model, x, y, optimizer, 3, what=family)
    trainer.export_onnx(tmp_path / "tuned.onnx", proto)
    session = onnxruntime.InferenceSession(str(tmp_path / "tuned.onnx"), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    np.testing.assert_allclose(session.run(None, {name: x.numpy()})[0], trainer.evaluate(x), rtol=1e-5, atol=1e-5)
