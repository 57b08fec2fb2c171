"""The performance passes keep the numbers: pock-reorder-updates trains identically, and every
form pock-backend-switch can pick computes the gradients torch.autograd does."""

import re

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from oracle import assert_close_to_norm, torch_gradients
from pock_mlir.stages import STAGE_PIPELINES

STEPS = 5


def without(pass_name: str) -> dict:
    return {"lowered": ",".join(p for p in STAGE_PIPELINES["lowered"].split(",") if p.split("{")[0] != pass_name)}


def forcing(form: str) -> dict:
    return {"lowered": STAGE_PIPELINES["lowered"].replace("pock-backend-switch{target={target}}",
                                                          f"pock-backend-switch{{force={form}}}")}


def make_cnn():
    """A dense 3x3 conv, a strided depthwise conv, a pointwise conv and a strided dense conv:
    every shape family the backend forms distinguish."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1, groups=8),
                         nn.Conv2d(8, 12, 1), nn.ReLU(), nn.Conv2d(12, 6, 3, 2, 1), nn.Flatten(), nn.Linear(24, 4))


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
    plain = pock.compile_training(model, x, y, optimizer=optimizer, pipelines=without("pock-reorder-updates"))
    assert "pock-reorder-updates" in STAGE_PIPELINES["lowered"]
    assert reordered.ir("lowered") != plain.ir("lowered")  # the pass did move something
    losses, state = train(reordered, x, y)
    want_losses, want_state = train(plain, x, y)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for name, value in want_state.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("form", ["direct", "im2col", "patches"])
def test_backend_forms_match_autograd(form, cnn_batch):
    x, y = cnn_batch
    model = make_cnn()
    program = pock.compile_training(model, x, y, pipelines=forcing(form))
    report = program.backend_report()
    assert f"{form} " in report and "forced by force=" in report
    # one count of convolutions, stated once: the per-op lines below the header
    counts = re.findall(r"(\d+) convolution", report)
    assert counts == [str(len(re.findall(r"^  \S+ +", report, re.M)))], report
    assert "matmuls: plain (the program has convolutions;" in report
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
    from torch_mlir import ir
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    from torch_mlir.extras.fx_importer import FxImporter

    from pock_mlir.context import make_context
    from pock_mlir.passes import run_pipeline
    from pock_mlir.runtime.workspace import ModuleFunctions
    from pock_mlir.targets import resolve_target

    class Backward(nn.Module):
        def forward(self, g, x, w):
            gi, gw, gb = torch.ops.aten.convolution_backward(g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1,
                                                             [True, True, True])
            return gi, gw, gb

    g = torch.Generator().manual_seed(2)
    x, w, grad = torch.randn(2, 4, 7, 7, generator=g), torch.randn(6, 4, 3, 3, generator=g), torch.randn(2, 6, 4, 4, generator=g)
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
            "main", *(rt.asdevicearray(config.device, t.numpy()) for t in (grad, x, w)))
        for name, value, expected in zip(("input", "weight", "bias"), got, want):
            assert_close_to_norm(np.asarray(value.to_host()), expected.numpy(), 1e-5, f"{form} {name} gradient")
