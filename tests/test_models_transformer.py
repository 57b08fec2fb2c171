"""Whole transformers against PyTorch: gradients vs torch.autograd and 10-step trajectories vs
torch.optim, for a BERT-like encoder classifier and a LLaMA-like decoder with tied embeddings."""

import os
import sys

import numpy as np
import pytest
import torch
from oracle import assert_close_to_norm, torch_gradients, torch_trajectory

import pock_mlir as pock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models.transformer import BertConfig, BertLike, LlamaConfig, LlamaLike, token_cross_entropy  # noqa: E402

STEPS = 10


def bert_case():
    torch.manual_seed(0)
    model = BertLike(BertConfig(vocab=64, max_len=16, dim=32, heads=4, layers=2, hidden=64, classes=3))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (4, 16), generator=g)
    ids[0, 10:] = 0  # padded sequences: padding rows of the embedding get no gradient
    ids[2, 5:] = 0
    # SGD, not Adam: the key bias's gradient is zero up to rounding (softmax ignores a shift per
    # query), and Adam would scale that rounding noise up to full-size, implementation-specific steps.
    return model, ids, torch.tensor([0, 2, 1, 2]), "cross_entropy", pock.SGD(lr=0.1, momentum=0.9)


def llama_case():
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(vocab=64, max_len=16, dim=32, heads=4, kv_heads=2, layers=2, hidden=64))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, 17), generator=g)
    target = tokens[:, 1:].clone()
    target[1, :3] = -100  # ignored positions (ignore_index)
    return model, tokens[:, :-1], target, token_cross_entropy, pock.AdamW(lr=1e-2, weight_decay=0.01)


CASES = {"bert": bert_case, "llama": llama_case}


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    model, ids, target, loss, optimizer = CASES[request.param]()
    program = pock.compile_training(
        model, ids, target, loss=loss, optimizer=optimizer, functions=("step", "gradients")
    )  # one IREE module for both
    return request.param, model, ids, target, loss, optimizer, program


def test_gradients_match_autograd(compiled):
    name, model, ids, target, loss_fn, _, program = compiled
    loss, grads = program.trainer().gradients(ids, target)
    want_loss, want = torch_gradients(model, ids, target, loss=loss_fn)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    for n in want:
        assert_close_to_norm(grads[n], want[n], 1e-4, n)
    if name == "bert":
        np.testing.assert_array_equal(grads["tokens.weight"][0], 0.0)  # the padding_idx row
    else:  # one tied parameter, whose gradient sums the embedding's and the output projection's
        assert "lm_head.weight" not in [p.name for p in program.signature.params]


def test_training_matches_torch_optim(compiled):
    _, model, ids, target, loss_fn, optimizer, program = compiled
    trainer = program.trainer()
    losses = [trainer.step(ids, target) for _ in range(STEPS)]
    want_losses, want_params = torch_trajectory(model, ids, target, optimizer, STEPS, loss=loss_fn)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    assert losses[-1] < losses[0]
    state = trainer.state_dict()
    for n, value in want_params.items():
        assert_close_to_norm(state[n], value, 1e-4, n)


def test_evaluate_matches_the_model(compiled):
    _, model, ids, _, _, _, program = compiled
    np.testing.assert_allclose(program.trainer().evaluate(ids), model(ids).detach().numpy(), rtol=1e-4, atol=1e-5)
