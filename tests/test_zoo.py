"""Library models as users have them (#18): Hugging Face transformers' LLaMA (GQA, RoPE, tied
embeddings), GPT-2 and a BERT classifier, random-init tiny configs (nothing is downloaded), each
with the user's own loss on the library's ModelOutput and int64 targets, as written for PyTorch.
Gradients and three SGD-momentum steps against PyTorch (eval mode: dropout off, so PyTorch is an
exact oracle). Each model compiles once (module fixture)."""

import pytest
import torch
import torch.nn.functional as F

import pock_mlir as pock
from oracle import assert_gradients_close, assert_trajectory_close, torch_gradients

transformers = pytest.importorskip("transformers")  # in the dev extras; `make test` installs it

OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)
VOCAB, BATCH, SEQ = 97, 2, 16


def next_token_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def classification_loss(out, y):
    return F.cross_entropy(out.logits, y)


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True))


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=64,
                                                                n_layer=2, n_head=4))


def bert():
    return transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=32, num_labels=3))


MODELS = {"hf-llama": (llama, next_token_loss), "hf-gpt2": (gpt2, next_token_loss),
          "hf-bert-classifier": (bert, classification_loss)}


def batch(name):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    target = torch.randint(0, 3, (BATCH,), generator=g) if "classifier" in name else \
        torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, target


@pytest.fixture(scope="module", params=list(MODELS))
def compiled(request):
    make, loss = MODELS[request.param]
    torch.manual_seed(0)
    model = make().eval()
    ids, target = batch(request.param)
    assert target.dtype == torch.int64
    return request.param, model, loss, pock.compile_training(model, ids, target, loss=loss, optimizer=OPTIMIZER)


def test_gradients_match_autograd(compiled):
    name, model, loss, program = compiled
    ids, target = batch(name)
    got_loss, grads = program.trainer().gradients(ids, target)
    want_loss, want = torch_gradients(model, ids, target, loss=loss)
    assert got_loss == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, want, 1e-4, name)


def test_three_sgd_momentum_steps_match_torch_optim(compiled):
    name, model, loss, program = compiled
    ids, target = batch(name)
    trainer = program.trainer()
    losses = [trainer.step(ids, target) for _ in range(3)]
    assert_trajectory_close(losses, trainer.state_dict(), model, ids, target, OPTIMIZER, 3, what=name, loss=loss)


def test_evaluate_returns_the_logits(compiled):
    name, model, _, program = compiled
    ids, _ = batch(name)
    with torch.no_grad():
        want = model(ids).logits.numpy()
    got = program.trainer().evaluate(ids)
    assert got.shape == want.shape
    assert abs(got - want).max() <= 1e-4 * abs(want).max()
