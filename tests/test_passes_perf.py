"""The performance passes keep the numbers: pock-reorder-updates trains identically and frees
each convolution's gradient at its update, and every form pock-backend-switch can pick computes
the gradients torch.autograd does."""

import re

import numpy as np
import pytest
import torch
import torch.nn as nn
from oracle import assert_close_to_norm, torch_gradients

import pock_mlir as pock
from pock_mlir.abi import TRAIN_STEP_INTO
from pock_mlir.conv_forms import FORM_NAMES
from pock_mlir.runtime.artifact import trainer_module
from pock_mlir.stages import STAGE_PIPELINES, pipelines_with_switch, pipelines_without

STEPS = 5


def make_cnn():
    """Dense 3x3 convs (the second unpadded, so that its flipped input gradient pads), a strided
    depthwise conv, a pointwise conv and a strided dense conv: every shape family the backend forms
    distinguish."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, 1, 1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.Conv2d(8, 8, 3, 2, 1, groups=8),
        nn.Conv2d(8, 12, 1),
        nn.ReLU(),
        nn.Conv2d(12, 6, 3, 2, 1),
        nn.Flatten(),
        nn.Linear(24, 4),
    )


@pytest.fixture(scope="module")
def cnn_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 4, (2,), generator=g)


def train(program, x, y):
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    return losses, trainer.state_dict()


def test_reorder_updates_trains_identically(cnn_batch):
    x, y = cnn_batch
    optimizer = pock.AdamW(lr=1e-2)  # three results per update, and the step count: the most to move
    model = make_cnn()
    reordered = pock.compile_training(model, x, y, optimizer=optimizer)
    plain = pock.compile_training(model, x, y, optimizer=optimizer, pipelines=pipelines_without("pock-reorder-updates"))
    assert "pock-reorder-updates" in STAGE_PIPELINES["lowered"]
    assert reordered.ir("lowered") != plain.ir("lowered")  # the pass did move something
    losses, state = train(reordered, x, y)
    want_losses, want_state = train(plain, x, y)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for name, value in want_state.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_reorder_updates_frees_each_convolution_gradient_at_its_update():
    """A convolution's weight gradient is a buffer of its own under IREE (a linear layer's fuses
    into its update): with the updates and their non-finite-loss selects moved to the gradients,
    the step's workspace (IREE's schedule of train_step_into) holds less than without the pass,
    which keeps every such gradient to the end of the step."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.Flatten(),
        nn.Linear(64 * 16, 10),
    )
    x, y = torch.randn(2, 3, 4, 4), torch.randint(0, 10, (2,))
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    workspace = {}
    for label, pipelines in (("reordered", None), ("plain", pipelines_without("pock-reorder-updates"))):
        program = pock.compile_training(model, x, y, optimizer=optimizer, functions=(), pipelines=pipelines)
        workspace[label] = program.schedule(trainer_module(TRAIN_STEP_INTO)).workspace_bytes
    last_gradient = 4 * model[6].weight.numel()  # the backward's first convolution gradient
    assert workspace["reordered"] <= workspace["plain"] - last_gradient, workspace


@pytest.mark.parametrize("form", FORM_NAMES)
def test_backend_forms_match_autograd(form, cnn_batch):
    x, y = cnn_batch
    model = make_cnn()
    program = pock.compile_training(
        model, x, y, pipelines=pipelines_with_switch(f"force={form}"), functions=("gradients",)
    )
    report = program.backend_report()
    assert f"{form} " in report and "forced by force=" in report
    # one count of convolutions, stated once: the per-op lines below the header
    counts = re.findall(r"(\d+) convolution", report)
    assert counts == [str(len(re.findall(r"^  \S+ +", report, re.M)))], report
    assert "matmuls: plain (convolutions carry most of the FLOPs, no attention;" in report
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)


def test_per_image_form_of_a_1d_pointwise_conv():
    """A pointwise nn.Conv1d takes the 2-D forms at height 1, per-image too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 6, 1), nn.ReLU(), nn.Conv1d(6, 3, 1), nn.Flatten(), nn.Linear(15, 2))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 4, 5, generator=g), torch.randint(0, 2, (2,), generator=g)
    program = pock.compile_training(
        model, x, y, pipelines=pipelines_with_switch("force=per-image"), functions=("gradients",)
    )
    assert program.backend_report().count("per-image ") == 5  # two forwards, two weight and one input gradient
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)


def test_convolution_backward_forms_match_torch():
    """torch.aten.convolution_backward (IR that did not come through pock's conv rule) in each
    form, compiled by IREE, against torch's own convolution_backward."""
    import iree.compiler as ic
    import iree.runtime as rt
    from pock_mlir.passes import run_pipeline
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    from pock_mlir.context import make_context
    from pock_mlir.runtime.workspace import ModuleFunctions
    from pock_mlir.targets import resolve_target

    class Backward(nn.Module):
        def forward(self, g, x, w):
            gi, gw, gb = torch.ops.aten.convolution_backward(
                g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]
            )
            return gi, gw, gb

    g = torch.Generator().manual_seed(2)
    x, w, grad = (
        torch.randn(2, 4, 7, 7, generator=g),
        torch.randn(6, 4, 3, 3, generator=g),
        torch.randn(2, 6, 4, 4, generator=g),
    )
    want = Backward()(grad, x, w)
    exported = torch.export.export(Backward(), (grad, x, w)).run_decompositions(get_decomposition_table())
    for form in ("direct", "im2col"):
        with make_context() as context:
            importer = FxImporter(context=context)
            importer.import_frozen_program(exported, func_name="main")
            run_pipeline(importer.module, f"pock-backend-switch{{force={form}}},canonicalize")
            text = str(importer.module)
        assert ("convolution_backward" in text) == (form == "direct")
        vmfb = ic.compile_str(text, extra_args=["--iree-input-type=torch", *resolve_target("host").compile_flags()])
        config = rt.Config("local-task")
        context = rt.SystemContext(config=config)
        context.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb))
        got = ModuleFunctions(context, config.device, ("main",))(
            "main", *(rt.asdevicearray(config.device, t.numpy()) for t in (grad, x, w))
        )
        for name, value, expected in zip(("input", "weight", "bias"), got, want):
            assert_close_to_norm(np.asarray(value.to_host()), expected.numpy(), 1e-5, f"{form} {name} gradient")


def _square(n, c, h, o, k, stride, pad, groups, dilation=1):
    from pock_mlir.conv_forms import ConvShape, Window

    return ConvShape(n, c, o, groups, Window.of((k, k), (stride, stride), (pad, pad), (dilation, dilation), (h, h)))


def _shapes():
    """Every family the forms distinguish, and the window shapes only the gradients' forms cover."""
    from pock_mlir.conv_forms import ConvShape, Window

    return {
        "dense 3x3/s2": _square(2, 3, 7, 4, 3, 2, 1, 1),
        "strided 1x1": _square(2, 4, 6, 8, 1, 2, 0, 1),
        "pointwise": _square(2, 4, 5, 6, 1, 1, 0, 1),
        "depthwise 3x3/s2": _square(2, 6, 7, 6, 3, 2, 1, 6),
        "grouped 3x3": _square(2, 4, 6, 6, 3, 1, 1, 2),
        "dilated 3x3": _square(2, 3, 9, 4, 3, 1, 2, 1, dilation=2),
        "1x3 kernel, stride (2, 1)": ConvShape(2, 3, 5, 1, Window.of((1, 3), (2, 1), (0, 1), (1, 1), (6, 7))),
        # one output row, padded rows unread: IREE 3.13 cannot compile these as they are (needs_fitting)
        "dense 3x3/s2 to 1x1": _square(2, 4, 2, 6, 3, 2, 1, 1),
        "depthwise 5x5/s2 to 1x1": _square(2, 6, 2, 6, 5, 2, 2, 6),
        # input rows past the padding that no window reads (patches crops them)
        "depthwise 2x2/s2 on 5x5": _square(2, 4, 5, 4, 2, 2, 0, 4),
    }


@pytest.mark.parametrize("name", list(_shapes()))
def test_every_form_bench_measures_is_the_convolution(name):
    """The functions bench.iree_study times are the forms pock-backend-switch emits (the same
    conv_forms functions); each, compiled by IREE (all of a shape's in one module), computes
    torch's convolution and gradients, and each pair of gradient forms both gradients of g * g."""
    import iree.runtime as rt

    from bench.iree_study import _reference, load_functions
    from pock_mlir.conv_forms import CONV_OPS, GRADIENTS
    from pock_mlir.targets import resolve_target
    from pock_mlir.tune import form_functions

    shape = _shapes()[name]
    g = torch.Generator().manual_seed(3)
    x, w, grad = (
        torch.randn(dims, generator=g) for dims in (shape.input_shape(), shape.weight_shape(), shape.output_shape())
    )
    forms = {
        f"f{i}": (op, form)
        for i, (op, form) in enumerate((op, f) for op in (*CONV_OPS, GRADIENTS) for f in shape.forms(op))
    }
    config, functions = load_functions(
        form_functions({fn: (shape, op, form) for fn, (op, form) in forms.items()}),
        tuple(resolve_target("host").compile_flags()),
        tuple(forms),
    )
    for fn, (op, form) in forms.items():
        wants = _reference(shape, op, grad, x, w)
        args = (x, w) if op == "forward" else (grad, x, w)
        gots = functions[fn](*(rt.asdevicearray(config.device, a.numpy()) for a in args))
        assert len(gots) == len(wants) == (2 if op == GRADIENTS else 1)
        for got, want in zip(gots, wants):
            assert_close_to_norm(got, want.numpy(), 1e-5, f"{name} {op} {form}")
    assert {op for op, _ in forms.values()} == {*CONV_OPS, GRADIENTS}
