"""State as PyTorch has it, and evaluation as model.eval() computes it (#61).

Trainer.state_dict(), pock-train's export and checkpoints hold exactly the model's state_dict keys
(a tied weight under each of its keys, no non-persistent buffer), so the strict
model.load_state_dict takes them; evaluate and loss run the forward pass of the model in eval mode
(dropout off, BatchNorm on its running statistics), train_mode=True the compiled mode's. The oracle
is PyTorch: the model's own state_dict, load_state_dict(strict=True), its eval-mode outputs, and its
train-mode outputs under the same dropout masks (pock_mlir.dropout.SeededDropout)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.numpy import load_file, save

import pock_mlir as pock
from pock_mlir.bundle import write_bundle
from pock_mlir.checkpoint import FORMAT_BY_NAME, _tensors_sha256, load_checkpoint
from pock_mlir.dropout import SeededDropout
from pock_mlir.runtime import InputError
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.tools import pock_train

VOCAB, BATCH, SEQ = 16, 4, 3


class TiedDecoder(nn.Module):
    """A head sharing the embedding's weight, a non-persistent buffer, dropout and BatchNorm: each
    thing the model's state_dict and eval mode treat differently."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.drop = nn.Dropout(0.3)
        self.norm = nn.BatchNorm1d(SEQ)
        self.head = nn.Linear(8, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("offsets", torch.linspace(-1, 1, 8), persistent=False)

    def forward(self, ids):
        return self.head(self.norm(self.drop(self.embed(ids) + self.offsets)))


def token_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TiedDecoder().train()


@pytest.fixture(scope="module")
def program(model):
    return pock.compile_training(
        model, *batch(0), loss=token_loss, optimizer=pock.SGD(lr=0.5, momentum=0.9), functions="all"
    )


def torch_state(state):
    return {key: torch.from_numpy(value) for key, value in state.items()}


def test_state_dict_has_the_models_keys_and_loads_strictly(model, program):
    trainer = program.trainer()
    for seed in range(3):
        trainer.step(*batch(seed))
    state = trainer.state_dict()
    assert list(state) == list(model.state_dict())  # head.weight too, offsets not
    np.testing.assert_array_equal(state["head.weight"], state["embed.weight"])
    assert list(trainer.merged_state_dict()) == list(model.state_dict())
    tuned = copy.deepcopy(model)
    tuned.load_state_dict(torch_state(state))  # strict
    assert tuned.head.weight is tuned.embed.weight
    tuned.eval()
    x, y = batch(5)
    with torch.no_grad():
        want = tuned(x)
    assert float(tuned.norm.num_batches_tracked) == 3
    np.testing.assert_allclose(trainer.evaluate(x), want.numpy(), rtol=1e-5, atol=1e-6)
    assert trainer.loss(x, y) == pytest.approx(token_loss(want, y).item(), rel=1e-5)
    trainer.load_state_dict(state)  # and back: the keys state_dict() gave
    np.testing.assert_array_equal(trainer.state_dict()["embed.weight"], state["embed.weight"])


def test_train_mode_is_the_compiled_forward_with_the_seeds_masks(model, program):
    """train_mode=True: dropout masks of the trainer's seed and BatchNorm on the batch's
    statistics, as the model in train mode computes them under SeededDropout with that seed."""
    trainer = program.trainer()
    trainer.seed = 7
    x, y = batch(6)
    eager = copy.deepcopy(model)  # a train-mode forward updates the running statistics
    with torch.no_grad(), SeededDropout(torch.tensor(7, dtype=torch.int32)) as dropout:
        want = eager(x)
    assert dropout.calls == 1
    np.testing.assert_allclose(trainer.evaluate(x, train_mode=True), want.numpy(), rtol=1e-5, atol=1e-6)
    assert trainer.loss(x, y, train_mode=True) == pytest.approx(token_loss(want, y).item(), rel=1e-5)
    assert not np.allclose(trainer.evaluate(x), want.numpy(), atol=1e-3)  # eval mode is another forward


def test_one_export_where_eval_mode_computes_alike(program):
    """An MLP without dropout or BatchNorm is exported once (evaluate calls the step's forward);
    the decoder's eval-mode forward is an export of its own."""
    assert "call @forward_loss_eval" in program.ir("imported")
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    imported = pock.compile_training(mlp, torch.randn(2, 4), torch.tensor([0, 2]), functions=()).ir("imported")
    assert "forward_loss_eval" not in imported and "call @forward_loss" in imported


def test_load_state_dict_says_what_is_not_in_the_models_state(program):
    trainer = program.trainer()
    state = trainer.state_dict()
    with pytest.raises(InputError, match="offsets: not in the model's state_dict, a non-persistent buffer"):
        trainer.load_state_dict({**state, "offsets": np.zeros(8, np.float32)})
    with pytest.raises(InputError, match="embed.weight and head.weight are one tied weight"):
        trainer.load_state_dict({**state, "head.weight": state["head.weight"] + 1})
    with pytest.raises(InputError, match="state_dict lacks head.weight"):
        trainer.load_state_dict({k: v for k, v in state.items() if k != "head.weight"})
    trainer.load_state_dict({"head.weight": state["head.weight"] * 2}, strict=False)  # one key sets the weight
    np.testing.assert_array_equal(trainer.state_dict()["embed.weight"], state["embed.weight"] * 2)


@pytest.fixture(scope="module")
def bundle(program, tmp_path_factory):
    return write_bundle(
        program,
        tmp_path_factory.mktemp("state") / "bundle",
        example_inputs=batch(0)[0],
        example_target=batch(0)[1],
        loss=token_loss,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "data.npz"
    (x, y), (x_val, y_val) = batch(1), batch(2)
    np.savez(
        path, x_train=np.concatenate([x, x]), y_train=np.concatenate([y, y]), x_val=x_val.numpy(), y_val=y_val.numpy()
    )
    return path


def test_pock_train_exports_and_checkpoints_the_models_keys(model, bundle, data, tmp_path, capsys):
    """The export loads into the model with strict=True and gives the validation loss pock-train
    reported, which is the eval-mode one; the checkpoint holds the model's keys too."""
    assert (
        pock_train.main(
            [
                str(bundle),
                "--data",
                str(data),
                "--checkpoint",
                str(tmp_path / "run.ckpt"),
                "--export",
                str(tmp_path / "tuned.safetensors"),
            ]
        )
        == 0
    )
    reported = float(capsys.readouterr().out.split("val_loss ")[1].split(",")[0])
    exported = load_file(tmp_path / "tuned.safetensors")
    assert set(exported) == set(model.state_dict())
    tuned = copy.deepcopy(model)
    tuned.load_state_dict(torch_state(exported))
    tuned.eval()
    x_val, y_val = batch(2)
    with torch.no_grad():
        assert reported == pytest.approx(token_loss(tuned(x_val), y_val).item(), rel=1e-5)
    with safe_open(tmp_path / "run.ckpt", "np") as f:
        assert {k.removeprefix("model/") for k in f.keys() if k.startswith("model/")} == set(model.state_dict())


def test_a_checkpoint_by_parameter_name_still_loads(bundle, data, tmp_path):
    """A pock-checkpoint-1 file (parameters and buffers by name: the non-persistent buffer in it,
    the head's key not) loads as the model's keys."""
    assert (
        pock_train.main(
            [
                str(bundle),
                "--data",
                str(data),
                "--checkpoint",
                str(tmp_path / "new.ckpt"),
                "--export",
                str(tmp_path / "tuned.safetensors"),
            ]
        )
        == 0
    )
    with safe_open(tmp_path / "new.ckpt", "np") as f:
        metadata = f.metadata()
    tensors = load_file(tmp_path / "new.ckpt")
    old = {n: v for n, v in tensors.items() if n != "model/head.weight"}
    old["model/offsets"] = np.linspace(-1, 1, 8, dtype=np.float32)
    (tmp_path / "old.ckpt").write_bytes(
        save(old, metadata={**metadata, "format": FORMAT_BY_NAME, "tensors_sha256": _tensors_sha256(old)})
    )
    loaded, new = (load_checkpoint(tmp_path / name, load_bundle(bundle)) for name in ("old.ckpt", "new.ckpt"))
    assert set(loaded.state_dict) == set(new.state_dict)
    for key, value in new.state_dict.items():
        np.testing.assert_array_equal(loaded.state_dict[key], value, err_msg=key)
    assert (
        pock_train.main(
            [
                str(bundle),
                "--data",
                str(data),
                "--epochs",
                "2",
                "--checkpoint",
                str(tmp_path / "old.ckpt"),
                "--resume",
                "--export",
                str(tmp_path / "resumed"),
            ]
        )
        == 0
    )


transformers = pytest.importorskip("transformers")


def test_a_bert_with_dropout_evaluates_as_model_eval():
    """A BERT classifier compiled in train mode (dropout on in the step): evaluate gives the eval-mode
    model's logits (their train-mode ones differ by about 1e-2), after a step too."""
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=97,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            num_labels=3,
        )
    ).train()
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 97, (2, 8), generator=g), torch.randint(0, 3, (2,), generator=g)
    loss = lambda out, y: F.cross_entropy(out.logits, y)  # noqa: E731
    trainer = pock.compile_training(bert, ids, labels, loss=loss, functions=("step",)).trainer()
    trainer.step(ids, labels)
    state = trainer.state_dict()
    assert list(state) == list(bert.state_dict())  # no bert.embeddings.position_ids (non-persistent)
    tuned = copy.deepcopy(bert)
    tuned.load_state_dict(torch_state(state))
    tuned.eval()
    with torch.no_grad():
        want = tuned(ids).logits.numpy()
    np.testing.assert_allclose(trainer.evaluate(ids), want, rtol=1e-4, atol=1e-5)
    tuned.train()
    with torch.no_grad():
        assert abs(tuned(ids).logits.numpy() - want).max() > 1e-3  # dropout would have made a difference
