"""Sparse updates end to end: frozen, bias-only, channel-sparse and preset schemes against
PyTorch with the same parameters frozen and the same channel rows updated; scheme errors."""

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn as nn
from oracle import assert_gradients_close, torch_gradients, torch_sparse_trajectory, torch_trajectory

import pock_mlir as pock
import pock_mlir.autodiff  # noqa: F401  (its rule files fill op_facts.FACTS)
from pock_mlir.op_facts import derivative_rules
from pock_mlir.sparse import SparseConfigError, SparseUpdate, resolve_sparse

STEPS = 10


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))


def make_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 4),
    )


def _inverted_residual(cin, cout, expand):
    hidden = cin * expand
    return nn.Sequential(
        nn.Conv2d(cin, hidden, 1, bias=False),
        nn.BatchNorm2d(hidden),
        nn.ReLU6(),
        nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
        nn.BatchNorm2d(hidden),
        nn.ReLU6(),
        nn.Conv2d(hidden, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
    )


class MiniMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, bias=False),
            nn.BatchNorm2d(8),
            _inverted_residual(8, 8, 2),
            _inverted_residual(8, 16, 2),
            _inverted_residual(16, 16, 2),
        )
        self.classifier = nn.Linear(16, 4)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class StackedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = nn.GRU(6, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 5)

    def forward(self, frames):
        outputs, _ = self.rnn(frames)
        return self.head(outputs[:, -1])


def batch(inputs_shape, classes):
    g = torch.Generator().manual_seed(1)
    return torch.randn(*inputs_shape, generator=g), torch.randint(0, classes, inputs_shape[:1], generator=g)


@dataclass(frozen=True)
class Case:
    make: object
    sparse: object
    optimizer: object
    rows: dict  # the rows each trainable parameter updates, written out for the oracle
    batch: tuple = ((8, 12), 5)  # input shape, classes


CASES = {
    "frozen_channels_full": Case(
        make_mlp,
        {"2": 0.5, "4": "full"},
        pock.SGD(lr=0.05, momentum=0.9, weight_decay=1e-2),
        {"2.weight": 8, "2.bias": 8, "4.weight": 5, "4.bias": 5},
    ),
    "bias_and_low_channels": Case(
        make_mlp,
        {"0": 0.25, "2": "bias", "4": "full"},
        pock.AdamW(lr=1e-2, weight_decay=0.1),
        {"0.weight": 8, "0.bias": 8, "2.bias": 16, "4.weight": 5, "4.bias": 5},
    ),
    "preset_bias_only": Case(make_mlp, "bias-only", pock.SGD(lr=0.1), {"0.bias": 32, "2.bias": 16, "4.bias": 5}),
    "preset_last_2": Case(
        make_mlp,
        SparseUpdate.preset("last", k=2),
        pock.SGD(lr=0.05, momentum=0.9, nesterov=True),
        {"2.weight": 16, "2.bias": 16, "4.weight": 5, "4.bias": 5},
    ),
    "preset_last_2_stacked_gru": Case(  # the GRU's second level and the head, not the whole GRU
        StackedGRU,
        "last-2",
        pock.SGD(lr=0.1, momentum=0.9),
        {f"rnn.{kind}_l1": 24 for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        | {"head.weight": 5, "head.bias": 5},
        ((4, 3, 6), 5),
    ),
}
if "aten.convolution" in derivative_rules():  # the CNN rules (pock_mlir/autodiff/rules/conv.py)
    CASES["cnn_channel_sparse_conv"] = Case(
        make_cnn,
        {"2": 0.5, "5": "full"},
        pock.AdamW(lr=1e-2),
        {"2.weight": 4, "2.bias": 4, "5.weight": 4, "5.bias": 4},
        ((4, 3, 6, 6), 4),
    )
    CASES["preset_mobilenet_with_channel_sparse_pointwise"] = Case(
        MiniMobileNet,
        {"preset": "mobilenet-last-1", "features.4.0": 0.5},
        pock.SGD(lr=0.05, momentum=0.9),
        {
            "features.1.bias": 8,
            "features.2.1.bias": 16,
            "features.2.4.bias": 16,
            "features.2.7.bias": 8,
            "features.3.1.bias": 16,
            "features.3.4.bias": 16,
            "features.3.7.bias": 16,
            "features.4.0.weight": 16,
            "features.4.1.bias": 32,
            "features.4.4.bias": 32,
            "features.4.7.bias": 16,
            "classifier.bias": 4,
        },
        ((4, 3, 8, 8), 4),
    )


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    case = CASES[request.param]
    model = case.make()
    x, y = batch(*case.batch)
    program = pock.compile_training(
        model, x, y, loss="cross_entropy", optimizer=case.optimizer, sparse=case.sparse, functions=("step", "gradients")
    )  # one IREE module for both
    return model, case.optimizer, case.rows, (x, y), program


def test_trainable_parameters_and_gradient_shapes(compiled):
    model, _, rows, _, program = compiled
    assert program.signature.trainable == [n for n, _ in model.named_parameters() if n in rows]
    shapes = dict((n, tuple(p.shape)) for n, p in model.named_parameters())
    for name, k in rows.items():
        assert program.signature.trainable_shape(name) == (k,) + shapes[name][1:]
    # the trained values count the rows kept, not the whole tensors
    assert program.signature.trained_values == sum(int(torch.zeros(shapes[n])[:k].numel()) for n, k in rows.items())


def test_kept_gradients_match_autograd(compiled):
    model, _, rows, (x, y), program = compiled
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(rows)
    assert_gradients_close(grads, {name: want[name][:k] for name, k in rows.items()}, what="gradient")


def test_loss_curve_matches_torch_with_the_same_parameters_frozen(compiled):
    model, optimizer, rows, (x, y), program = compiled
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    want_losses, want_params = torch_sparse_trajectory(model, x, y, optimizer, STEPS, rows)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert_gradients_close(trainer.state_dict(), want_params, what="final value")
    assert losses[-1] < losses[0]


def test_frozen_parameters_and_unkept_channels_never_change(compiled):
    model, _, rows, (x, y), program = compiled
    trainer = program.trainer()
    for _ in range(STEPS):
        trainer.step(x, y)
    state = trainer.state_dict()
    for name, p in model.named_parameters():
        initial = p.detach().numpy()
        k = rows.get(name, 0)
        np.testing.assert_array_equal(state[name][k:], initial[k:], err_msg=name)
        if k:
            assert not np.array_equal(state[name][:k], initial[:k]), f"{name} did not train"


def test_channel_slices_of_gradients_move_into_the_backward(compiled):
    _, _, _, _, program = compiled
    gradients = program.ir("sparse").split("func.func @gradients")[1]
    assert '"pock.channel_slice"' not in gradients  # pock-autodiff's slice of each full gradient is gone


def test_report_shows_each_policy_and_the_savings(compiled):
    model, _, rows, _, program = compiled
    result = program.report()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert {p.name: p.rows for p in result.parameters} == {n: rows.get(n, 0) for n in shapes}
    # pruning saves FLOPs; the op count may stay, as channel slices take the place of pruned ops
    assert result.sparse.ops <= result.full.ops and result.sparse.flops < result.full.flops
    assert result.sparse.gradient_bytes == 4 * sum(k * math.prod(shapes[n][1:]) for n, k in rows.items())
    assert result.full.gradient_bytes == 4 * sum(math.prod(shape) for shape in shapes.values())
    assert str(result).startswith(f"sparse backpropagation report: @train_step (scheme: {program.scheme.source})")


# -- scheme resolution ----------------------------------------------------------------------


def _resolve(sparse, model):
    scheme = resolve_sparse(sparse, model, {n: tuple(p.shape) for n, p in model.named_parameters()})
    return {
        n: (p.kind, p.channels(dict(model.named_parameters())[n].shape))
        for n, p in scheme.policies.items()
        if p.kind != "frozen"
    }


def test_later_patterns_override_earlier_ones():
    model = make_mlp()
    assert _resolve({"*": 0.5, "4": "full", "4.bias": "frozen"}, model) == {
        "0.weight": ("channels", 16),
        "0.bias": ("channels", 16),
        "2.weight": ("channels", 8),
        "2.bias": ("channels", 8),
        "4.weight": ("full", 5),
    }
    assert _resolve({"default": "full", "0": "frozen"}, model) == {
        "2.weight": ("full", 16),
        "2.bias": ("full", 16),
        "4.weight": ("full", 5),
        "4.bias": ("full", 5),
    }


def test_a_ratio_that_keeps_every_channel_is_full():
    assert _resolve({"4": 0.9}, make_mlp()) == {"4.weight": ("full", 5), "4.bias": ("full", 5)}


def test_yaml_and_json_files(tmp_path):
    model = make_mlp()
    (tmp_path / "s.yaml").write_text('default: frozen\n"*.bias": full\n"2": 0.25\n')
    (tmp_path / "s.json").write_text(json.dumps({"*.bias": "full", "2": 0.25}))
    want = {"0.bias": ("full", 32), "2.weight": ("channels", 4), "2.bias": ("channels", 4), "4.bias": ("full", 5)}
    assert _resolve(str(tmp_path / "s.yaml"), model) == want
    assert _resolve(tmp_path / "s.json", model) == want
    (tmp_path / "p.yaml").write_text("preset: last-1\n'0.bias': full\n")
    assert _resolve(str(tmp_path / "p.yaml"), model) == {
        "0.bias": ("full", 32),
        "4.weight": ("full", 5),
        "4.bias": ("full", 5),
    }


def test_mobilenet_preset_updates_biases_and_the_first_pointwise_conv_of_the_last_blocks():
    model = MiniMobileNet()
    kept = _resolve("mobilenet-last-2", model)
    assert kept == _resolve(SparseUpdate.preset("mobilenet", k=2), model)
    biases = {n for n, _ in model.named_parameters() if n.endswith("bias")}
    assert set(kept) == biases | {"features.3.0.weight", "features.4.0.weight"}


def test_transformer_preset_updates_attention_first_ffn_linear_norms_and_biases():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.TransformerEncoder(layer, 3, enable_nested_tensor=False), nn.Linear(16, 3)
    )
    kept = set(_resolve("transformer-last-1", model))
    names = [n for n, _ in model.named_parameters()]
    last = "1.layers.2."
    want = {n for n in names if n.endswith("bias") or ".norm" in n}
    want |= {last + "self_attn.in_proj_weight", last + "self_attn.out_proj.weight", last + "linear1.weight"}
    assert kept == want


def test_last_k_counts_normalizations_with_the_layer_before():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    assert set(_resolve("last-2", model)) == {"2.weight", "2.bias", "3.weight", "3.bias", "4.weight", "4.bias"}


def test_last_k_counts_each_level_of_a_stacked_recurrent_layer_with_both_directions():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(4, 8, num_layers=3, bidirectional=True), nn.Linear(16, 2))
    level_2 = {f"0.{kind}_l2{d}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh") for d in ("", "_reverse")}
    assert set(_resolve("last-2", model)) == level_2 | {"1.weight", "1.bias"}
    with pytest.raises(SparseConfigError, match=r"only 4 layers \(0\[layer 0\], 0\[layer 1\], 0\[layer 2\], 1\)"):
        _resolve("last-5", model)


@pytest.mark.parametrize(
    "sparse, message",
    [
        ({"4.wieght": "full"}, r"pattern '4.wieght' matches no parameter or module; closest names: 4.weight"),
        ({"features": 0.5}, r"pattern 'features' matches no parameter or module; closest names: "),
        ({"2": 0.0}, r"pattern '2': channel ratio must be in \(0, 1\], got 0.0"),
        ({"2": 1.5}, r"pattern '2': channel ratio must be in \(0, 1\], got 1.5"),
        (
            {"2": "half"},
            r"pattern '2': unknown policy 'half'; use full, frozen, bias, a ratio in \(0, 1\] or lora:r=8,alpha=16",
        ),
        ({"2": True}, r"pattern '2': unknown policy True"),
        ({"default": 2}, r"default: channel ratio must be in \(0, 1\], got 2"),
        ("last-9", r"preset 'last-9': the model has only 3 layers \(0, 2, 4\)"),
        (
            "mobilenet-last-1",
            r"preset 'mobilenet-last-1' found no depthwise-conv blocks in the model \(module types: "
            r"Linear, ReLU, Sequential\); use last-K or patterns instead",
        ),
        ("transformer-last-2", r"found no attention blocks"),
        ("last-two", r"sparse='last-two' is neither a preset .* nor an existing YAML/JSON file"),
        ({"preset": "mobilenet-4"}, r"sparse: unknown preset 'mobilenet-4'; presets: full, bias-only, last-K"),
        (42, r"sparse= takes None, a dict, a SparseUpdate, a preset name or a YAML/JSON path; got 42"),
    ],
)
def test_scheme_errors_name_the_problem(sparse, message):
    with pytest.raises(SparseConfigError, match=message):
        _resolve(sparse, make_mlp())


def test_bias_policy_on_a_module_without_bias_lists_modules_with_one():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(
        SparseConfigError,
        match=r"pattern '0': policy 'bias', but it matches no bias parameter "
        r"\(0.weight\); closest modules with a bias: 2",
    ):
        _resolve({"0": "bias"}, model)


def test_ratio_on_a_scalar_parameter():
    model = make_mlp()
    model.register_parameter("scale", nn.Parameter(torch.ones(())))
    with pytest.raises(
        SparseConfigError,
        match=r"pattern 'scale': ratio 0.5 on scale, a scalar with no "
        r"output-channel dimension; give it full or frozen",
    ):
        _resolve({"scale": 0.5}, model)


def test_mobilenet_preset_beyond_the_number_of_blocks():
    with pytest.raises(
        SparseConfigError,
        match=r"preset 'mobilenet-last-4': the model has only 3 depthwise-conv "
        r"blocks \(features.2, features.3, features.4\)",
    ):
        _resolve("mobilenet-last-4", MiniMobileNet())


def test_preset_constructor_errors():
    with pytest.raises(SparseConfigError, match="preset 'mobilenet' needs k"):
        SparseUpdate.preset("mobilenet")
    with pytest.raises(SparseConfigError, match="unknown preset 'resnet-last-2'"):
        SparseUpdate.preset("resnet", k=2)
    with pytest.raises(SparseConfigError, match="preset 'last-0' needs K >= 1"):
        SparseUpdate.preset("last", k=0)


def test_unparsable_yaml_suggests_quoting(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("*.bias: full\n")
    with pytest.raises(
        SparseConfigError, match=r"s.yaml: cannot parse .*; in YAML, quote patterns that start with '\*'"
    ):
        _resolve(str(path), make_mlp())
    path.write_text("- 0.weight\n")
    with pytest.raises(SparseConfigError, match=r"s.yaml: expected a mapping of patterns to policies, got list"):
        _resolve(str(path), make_mlp())


def test_compile_training_reports_scheme_errors():
    x, y = batch((8, 12), 5)
    with pytest.raises(SparseConfigError, match="pattern '9' matches no parameter or module"):
        pock.compile_training(make_mlp(), x, y, sparse={"9": "full"})


# -- pock-apply-sparse-config{config=FILE} on a training-stage module --------------------------

STEP_IR = """
func.func @step(%w0: !torch.vtensor<[4,3],f32>, %w1: !torch.vtensor<[8,4],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "fc0.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "fc1.weight", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %h = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[5,4],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[8,4],f32> -> !torch.vtensor<[4,8],f32>
  %o = torch.aten.mm %h, %t1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,8],f32> -> !torch.vtensor<[5,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %o, %none : !torch.vtensor<[5,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g1 = "pock.grad"(%loss, %p1) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,4],f32>) -> !torch.vtensor<[4,4],f32>
  return %loss, %g1 : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>
}
"""


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"fc0": "full", "fc1": 0.5},
            "'fc0.weight' is frozen in the input (no pock.grad, no optimizer state in the "
            "signature) and cannot be unfrozen by a pass",
        ),
        ({"fc1": 0.25}, "'fc1.weight' already has a 4-channel gradient in the input, the config asks for 2"),
        ({"fc2": "full"}, "pattern 'fc2' matches no parameter or module; closest names: fc1, fc0"),
    ],
)
def test_config_option_errors(tmp_path, capsys, config, message):
    from pock_mlir.tools.pock_opt import main as pock_opt

    (tmp_path / "step.mlir").write_text(STEP_IR)
    (tmp_path / "s.json").write_text(json.dumps(config))
    assert (
        pock_opt([str(tmp_path / "step.mlir"), "-p", f"pock-apply-sparse-config{{config={tmp_path / 's.json'}}}"]) == 1
    )
    assert message in capsys.readouterr().err


def test_a_wildcard_that_matches_nothing_is_a_warning_in_the_report():
    """One scheme file serves a model family: `*bias` on a model without biases trains nothing
    for it and says so; an exact name that matches nothing stays an error (above)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8, bias=False), nn.ReLU(), nn.Linear(8, 4, bias=False))
    x, y = torch.randn(4, 6), torch.randint(0, 4, (4,))
    program = pock.compile_training(model, x, y, sparse={"*bias": "full", "2.weight": "full"}, functions=())
    report = str(program.report())
    assert "warning: pattern '*bias' matches no parameter or module of this model" in report
    assert program.signature.trainable == ["2.weight"]


# -- parameters frozen the PyTorch way (requires_grad=False) ----------------------------------


def mlp_with_frozen_first_layer():
    model = make_mlp()
    for p in model[0].parameters():
        p.requires_grad = False
    return model


@pytest.mark.parametrize("sparse", [None, {"*": "full"}], ids=["no_scheme", "a_scheme_training_everything"])
def test_parameters_without_requires_grad_stay_frozen_as_torch_optim_leaves_them(sparse):
    model, (x, y) = mlp_with_frozen_first_layer(), batch((8, 12), 5)
    program = pock.compile_training(model, x, y, optimizer=pock.SGD(lr=0.1, momentum=0.9), sparse=sparse)
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(3)]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    want_losses, want = torch_trajectory(model, x, y, pock.SGD(lr=0.1, momentum=0.9), 3, trainable=trainable)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    state = trainer.state_dict()
    for n in ("0.weight", "0.bias"):
        np.testing.assert_array_equal(state[n], model.state_dict()[n].numpy())
    for n in trainable:
        np.testing.assert_allclose(state[n], want[n], rtol=1e-4, atol=1e-6)
    assert program.signature.trainable == sorted(trainable, key=list(model.state_dict()).index)
    assert "2 frozen by the model (requires_grad=False): 0.weight, 0.bias" in str(program.report())


def test_a_model_that_requires_no_gradient_is_an_error_before_tracing():
    model, (x, y) = make_mlp(), batch((8, 12), 5)
    model.requires_grad_(False)
    with pytest.raises(
        ValueError,
        match=r"every parameter is frozen \(the model sets requires_grad=False on all "
        r"of them\): there is nothing to train",
    ):
        pock.compile_training(model, x, y, functions=())
