"""Keyword inputs, model(**batch): tiny random Hugging Face seq2seq models (T5, BART) and a decoder
(Llama, computing its own loss from labels) trained with their keyword inputs against torch.optim; a
bundle of one round trip, pock-train on an npz of arrays named by keyword, a model file whose
example_batch() is a dict through pock-compile and pock-train, and a batch that does not match the
compiled call."""

import contextlib
import io
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from oracle import assert_close_to_norm, assert_gradients_close_to_float64, assert_trajectory_close, torch_trajectory
from safetensors.torch import load_file

import pock_mlir as pock
from pock_mlir.bundle import write_bundle
from pock_mlir.data import load_data
from pock_mlir.frontend import FrontendError
from pock_mlir.runtime import InputError, Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.tools import pock_compile, pock_train
from pock_mlir.tools.pock_compile import load_model_file
from pock_mlir.tools.pock_search import ExampleBatch

VOCAB, BATCH, SOURCE, TARGET = 40, 2, 6, 5
STEPS = 3


def token_ids(generator, *shape) -> torch.Tensor:
    return torch.randint(2, VOCAB, shape, generator=generator)


def seq2seq_batch(seed: int, samples: int = BATCH) -> tuple[dict, torch.Tensor]:
    """input_ids with the last positions of the second sample padded out by attention_mask."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(samples, SOURCE, dtype=torch.long)
    mask[1::2, 4:] = 0
    batch = {
        "input_ids": token_ids(generator, samples, SOURCE),
        "attention_mask": mask,
        "decoder_input_ids": token_ids(generator, samples, TARGET),
    }
    return batch, token_ids(generator, samples, TARGET)


def logits_cross_entropy(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def t5() -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )


T5_OPTIMIZER = pock.AdamW(lr=1e-2, weight_decay=0.01)


@pytest.fixture(scope="module")
def t5_program():
    """T5 compiled for its keyword batch, every function in one module (as a bundle holds it)."""
    batch, target = seq2seq_batch(0)
    return pock.compile_training(
        t5(), batch, target, loss=logits_cross_entropy, optimizer=T5_OPTIMIZER, functions="all"
    )


def test_t5_signature_names_the_keyword_inputs(t5_program):
    sig = t5_program.signature
    assert [(s.name, s.shape, s.dtype) for s in sig.inputs] == [
        ("input_ids", (BATCH, SOURCE), "int32"),
        ("attention_mask", (BATCH, SOURCE), "int32"),
        ("decoder_input_ids", (BATCH, TARGET), "int32"),
    ]
    assert sig.by_keyword == 3 and sig.output.name == "logits"


def test_t5_trains_with_keyword_inputs_as_torch_optim(t5_program):
    batch, target = seq2seq_batch(0)
    trainer = t5_program.trainer()
    reordered = dict(reversed(list(batch.items())))  # keywords match by name, in any order
    losses = [trainer.step(reordered, target) for _ in range(STEPS)]
    assert_trajectory_close(
        losses, trainer.state_dict(), t5(), batch, target, T5_OPTIMIZER, STEPS, loss=logits_cross_entropy, what="T5"
    )


def test_t5_gradients_loss_and_evaluate_take_the_keyword_batch(t5_program):
    batch, target = seq2seq_batch(1)
    trainer = t5_program.trainer()
    loss, grads = trainer.gradients(batch, target)
    assert_gradients_close_to_float64(grads, t5(), batch, target, loss=logits_cross_entropy)
    model = t5()
    with torch.no_grad():
        output = model(**batch)
    assert trainer.loss(batch, target) == pytest.approx(loss, rel=1e-6)
    assert loss == pytest.approx(logits_cross_entropy(output, target).item(), rel=1e-5)
    assert_close_to_norm(trainer.evaluate(batch), output.logits.numpy(), 1e-5, "logits")


@pytest.mark.parametrize(
    "inputs, message",
    [
        (lambda b: {k: v for k, v in b.items() if k != "attention_mask"}, "(missing attention_mask)"),
        (lambda b: {**b, "labels": b["decoder_input_ids"]}, "(unknown labels)"),
        (lambda b: tuple(b.values()), "got input0, input1, input2"),
    ],
    ids=["missing keyword", "unknown keyword", "positional"],
)
def test_a_batch_unlike_the_compiled_call_names_what_differs(t5_program, inputs, message):
    batch, target = seq2seq_batch(0)
    trainer = t5_program.trainer()
    with pytest.raises(InputError) as error:
        trainer.step(inputs(batch), target)
    assert str(error.value).startswith(
        "the model was compiled to take input_ids, attention_mask, decoder_input_ids by keyword; got "
    )
    assert message in str(error.value)
    assert trainer.steps_taken == 0


@pytest.fixture(scope="module")
def t5_bundle(t5_program, tmp_path_factory):
    batch, target = seq2seq_batch(0)
    return write_bundle(
        t5_program,
        tmp_path_factory.mktemp("t5") / "bundle",
        example_inputs=batch,
        example_target=target,
        loss=logits_cross_entropy,
    )


def test_t5_bundle_round_trip(t5_bundle):
    manifest = json.loads((t5_bundle / "manifest.json").read_text())
    assert [i["name"] for i in manifest["batch"]["inputs"]] == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert manifest["batch"]["by_keyword"] == 3
    batch, target = seq2seq_batch(0)
    for name, value in batch.items():
        np.testing.assert_array_equal(np.load(t5_bundle / "args" / "batch" / f"{name}.npy"), value.numpy())
    bundle = load_bundle(t5_bundle)
    assert bundle.signature.by_keyword == 3
    trainer = Trainer.from_bundle(bundle)
    losses = [trainer.step({k: v.numpy() for k, v in batch.items()}, target.numpy()) for _ in range(STEPS)]
    want, _ = torch_trajectory(t5(), batch, target, T5_OPTIMIZER, STEPS, loss=logits_cross_entropy)
    np.testing.assert_allclose(losses, want, rtol=1e-4)


def test_pock_train_reads_arrays_named_by_keyword(t5_bundle, tmp_path):
    train, train_target = seq2seq_batch(2, samples=3 * BATCH)
    val, val_target = seq2seq_batch(3, samples=BATCH)
    data = tmp_path / "data.npz"
    np.savez(
        data,
        **{f"{k}_train": v.numpy() for k, v in train.items()},
        y_train=train_target.numpy(),
        **{f"{k}_val": v.numpy() for k, v in val.items()},
        y_val=val_target.numpy(),
    )
    steps, real_step = [], Trainer.step

    def recording_step(self, inputs, target):
        steps.append(({k: torch.from_numpy(v).long() for k, v in inputs.items()}, torch.from_numpy(target).long()))
        return real_step(self, inputs, target)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as stdout:
        patch.setattr(Trainer, "step", recording_step)
        code = pock_train.main([str(t5_bundle), "--data", str(data), "--export", str(tmp_path / "tuned.safetensors")])
    assert code == 0 and len(steps) == 3
    model = t5()
    optimizer = T5_OPTIMIZER.torch_optimizer(model.parameters())
    for inputs, target in steps:
        optimizer.zero_grad()
        logits_cross_entropy(model(**inputs), target).backward()
        optimizer.step()
    with torch.no_grad():
        val_loss = logits_cross_entropy(model(**val), val_target).item()
    (printed,) = re.findall(r"val_loss (\d+\.\d+)", stdout.getvalue())
    assert float(printed) == pytest.approx(val_loss, abs=1e-4)  # printed to 4 decimals
    tuned = load_file(tmp_path / "tuned.safetensors")
    for name, value in model.state_dict().items():
        assert_close_to_norm(tuned[name].numpy(), value.numpy(), 1e-4, name)


def test_pock_train_names_a_missing_keyword_array(t5_bundle, tmp_path, capsys):
    train, target = seq2seq_batch(2, samples=BATCH)
    data = tmp_path / "data.npz"
    np.savez(
        data,
        input_ids_train=train["input_ids"].numpy(),
        decoder_input_ids_train=train["decoder_input_ids"].numpy(),
        y_train=target.numpy(),
    )
    assert pock_train.main([str(t5_bundle), "--data", str(data)]) == 1
    assert "lacks attention_mask_train" in capsys.readouterr().err


def test_bart_trains_with_masks_as_torch_optim():
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(
        transformers.BartConfig(
            vocab_size=VOCAB,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=16,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
        )
    )
    batch, target = seq2seq_batch(4)
    batch["decoder_attention_mask"] = torch.ones(BATCH, TARGET, dtype=torch.long)
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    program = pock.compile_training(
        model, batch, target, loss=logits_cross_entropy, optimizer=optimizer, functions=("step",)
    )
    trainer = program.trainer()
    losses = [trainer.step(batch, target) for _ in range(STEPS)]
    assert_trajectory_close(
        losses, trainer.state_dict(), model, batch, target, optimizer, STEPS, loss=logits_cross_entropy, what="BART"
    )


def model_loss(output, target):
    """The loss the model computed from its labels input (the target is the same labels)."""
    return output.loss


def test_llama_computing_its_loss_from_labels_trains_as_torch_optim():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=16,
            use_cache=False,
        )
    )
    generator = torch.Generator().manual_seed(5)
    ids = token_ids(generator, BATCH, SOURCE)
    mask = torch.ones(BATCH, SOURCE, dtype=torch.long)
    mask[1, 4:] = 0
    labels = ids.masked_fill(mask == 0, -100)  # padded positions count for nothing
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    optimizer = pock.AdamW(lr=1e-2)
    program = pock.compile_training(
        model, batch, labels, loss=model_loss, optimizer=optimizer, functions=("step", "evaluate")
    )
    assert program.signature.output.name == "logits"  # evaluate returns the logits, not the loss
    trainer = program.trainer()
    with torch.no_grad():
        assert_close_to_norm(trainer.evaluate(batch), model(**batch).logits.numpy(), 1e-5, "logits")
    losses = [trainer.step(batch, labels) for _ in range(STEPS)]
    assert_trajectory_close(
        losses, trainer.state_dict(), model, batch, labels, optimizer, STEPS, loss=model_loss, what="Llama"
    )


class Masked(torch.nn.Module):
    """forward(x, mask=None, scale=None): a positional input and optional keyword ones."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, mask=None, scale=None):
        out = self.linear(x)
        out = out * mask if mask is not None else out
        return out * scale if scale is not None else out


def test_positional_and_keyword_inputs_with_an_absent_one():
    torch.manual_seed(0)
    model = Masked()
    x, mask, target = torch.randn(BATCH, 4), (torch.rand(BATCH, 3) > 0.3).float(), torch.tensor([0, 2])
    optimizer = pock.SGD(lr=0.5)
    program = pock.compile_training(
        model, ((x,), {"mask": mask, "scale": None}), target, optimizer=optimizer, functions=("step",)
    )
    sig = program.signature
    assert [s.name for s in sig.inputs] == ["input0", "mask"] and sig.by_keyword == 1
    trainer = program.trainer()
    losses = [trainer.step((x, {"mask": mask}), target), trainer.step(((x,), {"mask": mask, "scale": None}), target)]
    assert_trajectory_close(losses, trainer.state_dict(), model, (x, {"mask": mask}), target, optimizer, 2)
    with pytest.raises(
        InputError,
        match=r"^the model was compiled to take input0 and mask by keyword; got input0 "
        r"and mask, scale by keyword \(unknown scale\)$",
    ):
        trainer.step((x, {"mask": mask, "scale": torch.ones(())}), target)


@pytest.mark.parametrize(
    "inputs, message",
    [
        (
            {"x": torch.randn(BATCH, 4), "mask": True},
            "keyword input 'mask': expected a torch.Tensor or numpy.ndarray, got bool; inputs are tensors",
        ),
        (
            (torch.randn(BATCH, 4), {"target": torch.ones(BATCH, 3)}),
            "keyword input(s) target: the compiled module gives the name(s) to its target",
        ),
        ({1: torch.randn(BATCH, 4)}, "named by the model's argument names; got the key(s) 1"),
    ],
    ids=["not a tensor", "reserved name", "not a name"],
)
def test_keyword_inputs_the_frontend_refuses(inputs, message):
    with pytest.raises(FrontendError) as error:
        pock.compile_training(Masked(), inputs, torch.tensor([0, 1]))
    assert message in str(error.value) and "\n" not in str(error.value)


MODEL_FILE = """
import torch


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, mask=None):
        return self.linear(x) * mask


def model():
    torch.manual_seed(0)
    return Masked()


def example_batch():
    return {"x": torch.zeros(2, 4), "mask": torch.ones(2, 3)}, torch.tensor([0, 1])
"""


def test_a_model_file_with_a_dict_batch_compiles_and_trains_on_named_arrays(tmp_path):
    (tmp_path / "masked.py").write_text(MODEL_FILE)
    with contextlib.redirect_stdout(io.StringIO()):
        assert (
            pock_compile.main(
                [str(tmp_path / "masked.py"), "-o", str(tmp_path / "bundle"), "--optimizer", "sgd:lr=0.5"]
            )
            == 0
        )
    generator = torch.Generator().manual_seed(6)
    x, mask = torch.randn(6, 4, generator=generator), (torch.rand(6, 3, generator=generator) > 0.3).float()
    target = torch.randint(0, 3, (6,), generator=generator)
    np.savez(tmp_path / "data.npz", x_train=x.numpy(), mask_train=mask.numpy(), y_train=target.numpy())
    model_file = load_model_file(str(tmp_path / "masked.py"))
    train, _ = load_data(str(tmp_path / "data.npz"), ExampleBatch(model_file, "masked.py"))  # what pock-search reads
    np.testing.assert_array_equal(train.batch(np.array([4, 1]))[0]["mask"], mask.numpy()[[4, 1]])
    steps, real_step = [], Trainer.step

    def recording_step(self, inputs, target):
        steps.append(({k: torch.from_numpy(v) for k, v in inputs.items()}, torch.from_numpy(target).long()))
        return real_step(self, inputs, target)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(Trainer, "step", recording_step)
        assert (
            pock_train.main(
                [
                    str(tmp_path / "bundle"),
                    "--data",
                    str(tmp_path / "data.npz"),
                    "--export",
                    str(tmp_path / "tuned.safetensors"),
                ]
            )
            == 0
        )
    assert len(steps) == 3
    model = model_file.model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for inputs, target in steps:
        optimizer.zero_grad()
        F.cross_entropy(model(**inputs), target).backward()
        optimizer.step()
    tuned = load_file(tmp_path / "tuned.safetensors")
    for name, value in model.state_dict().items():
        assert_close_to_norm(tuned[name].numpy(), value.detach().numpy(), 1e-5, name)
