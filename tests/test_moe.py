"""Mixture-of-experts decoders from Hugging Face transformers (#61), tiny random configs (nothing is
downloaded): Qwen3-MoE, Mixtral and OLMoE with 4 experts, top-2 routing, d=32, 1 layer, in the
library's default experts implementation (grouped_mm: tokens sorted by expert, counted with histc,
a grouped matmul that torch.export records as transformers' custom op) and in batched_mm (each
token's expert weights gathered, bmm). Gradients against torch.autograd, steps against
torch.optim, and a sparse scheme that trains the routers and the first half of every layer's
experts against torch.optim with the same parameters and expert rows frozen. The
frontend's decompositions of the grouped matmul and of histc are checked against the ops they
replace."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from oracle import (
    assert_close_to_norm,
    assert_gradients_close,
    torch_gradients,
    torch_sparse_trajectory,
    torch_trajectory,
)

import pock_mlir as pock
from pock_mlir.frontend import decompositions

transformers = pytest.importorskip("transformers")
from transformers.integrations import moe  # noqa: E402,F401  (registers transformers::grouped_mm_fallback)

VOCAB, EXPERTS, STEPS = 64, 4, 5
OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=1,  # a layer has every op a deeper stack repeats; each one more costs compile time
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    num_experts_per_tok=2,
    pad_token_id=1,
    eos_token_id=0,
    bos_token_id=0,
)
CONFIGS = {
    "qwen3-moe": lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(**COMMON, num_experts=EXPERTS, moe_intermediate_size=16, intermediate_size=64)
    ),
    "mixtral": lambda: transformers.MixtralForCausalLM(
        transformers.MixtralConfig(**COMMON, num_local_experts=EXPERTS, intermediate_size=16)
    ),
    "olmoe": lambda: transformers.OlmoeForCausalLM(
        transformers.OlmoeConfig(**COMMON, num_experts=EXPERTS, intermediate_size=16)
    ),
}
CASES = {name: (name, "grouped_mm") for name in CONFIGS} | {"qwen3-moe-batched-mm": ("qwen3-moe", "batched_mm")}


def make_model(name, experts_implementation="grouped_mm"):
    torch.manual_seed(0)
    model = CONFIGS[name]().eval()
    model.set_experts_implementation(experts_implementation)
    return model


def next_token_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 8), generator=g)


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    model, (ids, target) = make_model(*CASES[request.param]), batch()
    return model, pock.compile_training(
        model, ids, target, loss=next_token_loss, optimizer=OPTIMIZER, functions=("step", "gradients")
    )  # one IREE module for both


def test_gradients_match_autograd(compiled):
    model, program = compiled
    ids, target = batch()
    loss, grads = program.trainer().gradients(ids, target)
    want_loss, want = torch_gradients(model, ids, target, loss=next_token_loss)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    assert any(".mlp.gate." in n for n in want) and any(".experts." in n for n in want)
    for n in want:
        assert_close_to_norm(grads[n], want[n], 1e-4, n)


def test_training_matches_torch_optim(compiled):
    model, program = compiled
    ids, target = batch()
    trainer = program.trainer()
    losses = [trainer.step(ids, target) for _ in range(STEPS)]
    want_losses, want_params = torch_trajectory(model, ids, target, OPTIMIZER, STEPS, loss=next_token_loss)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    state = trainer.state_dict()
    for n, value in want_params.items():
        assert_close_to_norm(state[n], value, 1e-4, n)


def _rows(model, suffix_rows):
    """The rows of each parameter a scheme trains: every row of the parameters ending in a
    suffix given with None, the first k of those given with k."""
    return {
        n: p.shape[0] if k is None else k
        for n, p in model.named_parameters()
        for suffix, k in suffix_rows.items()
        if n.endswith(suffix)
    }


# On Qwen3-MoE: the routers, and the first half of every layer's experts (a ratio keeps the first
# rows of a parameter, and an experts tensor's rows are its experts), each by its parameter names.
SPARSE = {"*.mlp.gate": "full", "*.mlp.experts": 0.5}
SPARSE_ROWS = {
    ".mlp.gate.weight": None,
    ".mlp.experts.gate_up_proj": EXPERTS // 2,
    ".mlp.experts.down_proj": EXPERTS // 2,
}


def test_a_scheme_of_the_routers_and_half_the_experts_trains_as_torch_optim_does():
    model, (ids, target) = make_model("qwen3-moe"), batch()
    rows = _rows(model, SPARSE_ROWS)
    program = pock.compile_training(model, ids, target, loss=next_token_loss, optimizer=OPTIMIZER, sparse=SPARSE)
    assert program.signature.trainable == [n for n, _ in model.named_parameters() if n in rows]
    trainer = program.trainer()
    losses = [trainer.step(ids, target) for _ in range(STEPS)]
    want_losses, want_params = torch_sparse_trajectory(model, ids, target, OPTIMIZER, STEPS, rows, loss=next_token_loss)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    state = trainer.state_dict()
    assert_gradients_close(state, want_params, what="final value")
    for name, p in model.named_parameters():  # frozen parameters and the other experts stay as they were
        k = rows.get(name, 0)
        np.testing.assert_array_equal(state[name][k:], p.detach().numpy()[k:], err_msg=name)
        if k:
            assert not np.array_equal(state[name][:k], p.detach().numpy()[:k]), f"{name} did not train"


def test_the_grouped_matmul_decomposes_to_what_transformers_computes():
    """Rows offs[i-1]:offs[i] through expert i, an expert with no rows, and rows past offs[-1]
    (expert parallelism's sentinels), which the op leaves zero."""
    g = torch.Generator().manual_seed(0)
    rows, weight = torch.randn(7, 5, generator=g), torch.randn(4, 5, 3, generator=g)
    offs = torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    op = torch.ops.transformers.grouped_mm_fallback.default
    torch.testing.assert_close(decompositions()[op](rows, weight, offs), op(rows, weight, offs), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bins, bounds", [(4, (0, 3)), (7, (-1.5, 2.0))])
def test_histc_decomposes_to_torch_histc(bins, bounds):
    """Values below, at and above the bounds, on and near bin edges."""
    lo, hi = bounds
    g = torch.Generator().manual_seed(0)
    edges = torch.linspace(lo, hi, bins + 1)
    values = torch.cat(
        [
            torch.rand(500, generator=g) * (hi - lo + 2) + lo - 1,
            edges,
            edges.nextafter(edges + 1),
            edges.nextafter(edges - 1),
            torch.tensor([lo, hi, hi, lo - 1, hi + 1]),
        ]
    )
    histc = torch.ops.aten.histc.default
    torch.testing.assert_close(
        decompositions()[histc](values, bins, lo, hi), histc(values, bins, lo, hi), rtol=0, atol=0
    )
