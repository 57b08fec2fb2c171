"""Models and losses as users write them for PyTorch compile unchanged (#18): the model and the
loss see the batch in the dtypes the user gave (int64 class indices and token ids; the device takes
int32), the loss gets the model's output as the model returns it, and code that relies on eager
PyTorch's tensor layouts (a view of attention's output, as Hugging Face's GPT-2 does) traces."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_close_to_norm

import pock_mlir as pock


def assert_matches_autograd(program, model, loss, x, y) -> None:
    """The compiled loss and gradients against torch.autograd on the model as it is."""
    got_loss, grads = program.trainer().gradients(x, y)
    want = pock.frontend.resolve_loss(loss)(model(x), y)
    want.backward()
    assert got_loss == pytest.approx(want.item(), rel=1e-5)
    for name, p in model.named_parameters():
        assert_close_to_norm(grads[name], p.grad.numpy(), 1e-5, name)


class TokenModel(nn.Module):
    """Embedding lookup of int64 token ids, as language models do."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, ids):
        assert ids.dtype == torch.int64  # what eager PyTorch would give it
        return self.head(torch.tanh(self.embed(ids)))


def class_loss(out, y):
    return F.cross_entropy(out, y)  # no .long(): y is the user's int64


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=-100)


CASES = {
    "classes": (
        lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)),
        lambda g: (torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)),
        class_loss,
    ),
    "tokens": (
        TokenModel,
        lambda g: (torch.randint(0, 11, (2, 5), generator=g), torch.randint(0, 11, (2, 5), generator=g)),
        token_loss,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_pytorch_loss_on_int64_targets_compiles_and_matches_autograd(case):
    make_model, make_batch, loss = CASES[case]
    torch.manual_seed(0)
    model = make_model()
    x, y = make_batch(torch.Generator().manual_seed(1))
    assert y.dtype == torch.int64
    program = pock.compile_training(model, x, y, loss=loss, functions=("step", "gradients"))  # one module
    assert program.signature.target.dtype == "int32"  # the device's side of the boundary
    assert_matches_autograd(program, model, loss, x, y)
    assert np.isfinite(program.trainer().step(x.numpy(), y.numpy()))  # numpy's int64 too


@dataclasses.dataclass
class Output:
    """Like a Hugging Face ModelOutput: named tensors, None where the model has nothing."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    hidden: torch.Tensor


class Structured(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.body, self.head = kind, nn.Linear(6, 16), nn.Linear(16, 4)

    def forward(self, x):
        hidden = torch.relu(self.body(x))
        logits = self.head(hidden)
        if self.kind == "dict":
            return {"hidden": hidden, "logits": logits}
        if self.kind == "dataclass":
            return Output(None, logits, hidden)
        return hidden, (logits,)  # nested tuple


STRUCTURED = {
    "dict, string loss": ("dict", "cross_entropy", None),
    "dataclass, the user's loss": (
        "dataclass",
        lambda out, y: F.cross_entropy(out.logits, y) + out.hidden.mean(),
        None,
    ),
    "nested tuple, output=1": ("tuple", lambda out, y: F.cross_entropy(out[1][0], y), 1),
}


@pytest.mark.parametrize("case", STRUCTURED)
def test_structured_outputs_reach_the_loss_as_the_model_returns_them(case):
    kind, loss, selector = STRUCTURED[case]
    torch.manual_seed(0)
    model = Structured(kind)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)
    program = pock.compile_training(model, x, y, loss=loss, output=selector, functions=("evaluate", "gradients"))
    np.testing.assert_allclose(
        program.trainer().evaluate(x), model.head(torch.relu(model.body(x))).detach().numpy(), rtol=1e-5, atol=1e-6
    )  # evaluate returns the logits
    assert_matches_autograd(program, model, loss, x, y)


def test_a_selector_that_names_nothing_is_a_clear_error():
    from pock_mlir.frontend import FrontendError

    with pytest.raises(FrontendError, match="output='scores': the model's output has 'hidden', 'logits'"):
        pock.compile_training(Structured("dict"), torch.randn(8, 6), torch.zeros(8, dtype=torch.int64), output="scores")


class ViewsAttentionOutput(nn.Module):
    """Heads merged with reshape and flattened with view, as GPT-2's attention and Conv1D do: valid
    in eager PyTorch because the CPU attention kernel lays its output out as [B, T, H, D]."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(width, 3 * width), nn.Linear(width, 4)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        merged = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        return self.proj(merged.view(-1, c)).view(b, t, 4)


def test_code_relying_on_the_attention_kernels_layout_traces_and_matches_autograd():
    torch.manual_seed(0)
    model = ViewsAttentionOutput()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 5, 16, generator=g), torch.randint(0, 4, (2, 5), generator=g)
    program = pock.compile_training(model, x, y, loss=token_loss, functions=("gradients",))
    assert_matches_autograd(program, model, token_loss, x, y)


def test_a_cumulative_batch_norm_is_a_clear_error_naming_the_layer_and_the_fix():
    """momentum=None averages over the steps with 1 / num_batches_tracked, a Python float of a
    tensor that torch.export cannot trace: the error names the layer before any tracing."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=None), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    with pytest.raises(
        pock.FrontendError,
        match=r"^BatchNorm2d '1' has momentum=None .* give it a momentum \(torch's "
        r"default is 0.1\) or put it in eval mode$",
    ):
        pock.compile_training(model, x, y, functions=())
    pock.compile_training(model.eval(), x, y, functions=())  # eval mode: the running statistics stay as they are


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm is deprecated")
def test_a_hook_set_weight_trains_and_the_model_is_left_as_it_was():
    """torch.nn.utils.weight_norm recomputes `weight` from weight_g and weight_v in a hook before
    each call: the gradients reach g and v, and compiling leaves the module's own weight tensor
    in place (it had kept the trace's fake tensor, which the user's next forward or deepcopy hit)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.weight_norm(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 3))
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    weight = model[0].weight
    program = pock.compile_training(model, x, y, functions=("gradients",))
    assert model[0].weight is weight
    assert_matches_autograd(program, model, "cross_entropy", x, y)
