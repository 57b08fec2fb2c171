"""The LLM fine-tuning path (examples/llama_text.py): pock-train on a tokenized text against
torch.optim on the same windows, greedy decoding through the compiled forward against PyTorch's,
and pock-train's answers to token data that does not fit."""

import contextlib
import io
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import assert_close_to_norm
from safetensors.torch import load_file

import pock_mlir as pock
from pock_mlir.bundle import write_bundle
from pock_mlir.checkpoint import load_checkpoint
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.tools import pock_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from models.char_text import VOCAB, decode, encode, greedy_completion  # noqa: E402
from models.transformer import LlamaConfig, LlamaLike, token_cross_entropy  # noqa: E402

SEQ, BATCH = 16, 4
CONFIG = LlamaConfig(vocab=VOCAB, max_len=SEQ, dim=32, heads=4, kv_heads=2, layers=2, hidden=64)
LR, WEIGHT_DECAY = 1e-2, 0.01
# The paper's scheme on a 2-block model, transformer-last-1: every norm, and the attention
# projections and first FFN linear (gate) of the last block.
TRAINABLE = {
    "blocks.0.attention_norm.weight",
    "blocks.0.ffn_norm.weight",
    "blocks.1.attention_norm.weight",
    "blocks.1.ffn_norm.weight",
    "norm.weight",
    "blocks.1.attention.q.weight",
    "blocks.1.attention.k.weight",
    "blocks.1.attention.v.weight",
    "blocks.1.attention.o.weight",
    "blocks.1.gate.weight",
}
TEXT = encode(Path(textwrap.__file__).read_text())
TRAIN, VAL = TEXT[:350], TEXT[350:500]  # 21 windows of 16: 5 batches of 4 per epoch; 9 windows: 2 batches
EPOCHS, SEED = 2, 3


def llama() -> LlamaLike:
    torch.manual_seed(0)
    return LlamaLike(CONFIG)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    model = llama()
    x = torch.from_numpy(np.stack([TRAIN[i : i + SEQ] for i in range(BATCH)]))
    y = torch.from_numpy(np.stack([TRAIN[i + 1 : i + SEQ + 1] for i in range(BATCH)]))
    program = pock.compile_training(
        model,
        x,
        y,
        loss=token_cross_entropy,
        optimizer=pock.AdamW(lr=LR, weight_decay=WEIGHT_DECAY),
        sparse="transformer-last-1",
        functions="all",
    )
    return write_bundle(
        program, tmp_path_factory.mktemp("llm") / "bundle", example_inputs=x, example_target=y, loss=token_cross_entropy
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.npz"
    np.savez(path, tokens_train=TRAIN, tokens_val=VAL)
    return path


def train_recording(bundle, data, out: Path, *arguments) -> tuple[int, list[tuple[np.ndarray, np.ndarray, float]]]:
    """pock-train's exit code and the (inputs, target, loss) of every step it took, in order."""
    steps, real_step = [], Trainer.step

    def recording_step(self, inputs, target):
        loss = real_step(self, inputs, target)
        steps.append((np.array(inputs[0]), np.array(target), loss))
        return loss

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "step", recording_step)
        code = pock_train.main(
            [str(bundle), "--data", str(data), "--export", str(out / "tuned.safetensors"), *map(str, arguments)]
        )
    return code, steps


@pytest.fixture(scope="module")
def trained(bundle, data, tmp_path_factory):
    """Two epochs of pock-train on the token stream: (steps recorded, its stdout, the run directory)."""
    out = tmp_path_factory.mktemp("run")
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        code, steps = train_recording(
            bundle, data, out, "--epochs", EPOCHS, "--seed", SEED, "--checkpoint", out / "run.ckpt"
        )
    assert code == 0
    return steps, stdout.getvalue(), out


def window_starts(inputs: np.ndarray, target: np.ndarray, stream: np.ndarray) -> list[int]:
    """Where each row of a batch starts in the stream; asserts it is a window of it with the next-token target."""
    starts = []
    for x, y in zip(inputs, target):
        start = next(s for s in range(0, len(stream) - SEQ, SEQ) if np.array_equal(stream[s : s + SEQ], x))
        np.testing.assert_array_equal(y, stream[start + 1 : start + SEQ + 1])
        starts.append(start)
    return starts


def test_training_steps_are_shuffled_windows_of_the_stream(trained, bundle, data, tmp_path):
    steps, _, _ = trained
    batches_per_epoch = (len(TRAIN) - 1) // SEQ // BATCH
    assert len(steps) == EPOCHS * batches_per_epoch
    for epoch in range(EPOCHS):
        epoch_steps = steps[epoch * batches_per_epoch : (epoch + 1) * batches_per_epoch]
        starts = [s for x, y, _ in epoch_steps for s in window_starts(x, y, TRAIN)]
        assert len(set(starts)) == len(starts)  # no window twice in an epoch
        assert starts != sorted(starts)  # shuffled
        assert all(x.dtype == np.int32 and x.shape == (BATCH, SEQ) for x, _, _ in epoch_steps)
    # The order is the seed's: the same again for the same seed, another for another seed.
    for seed, same in [(SEED, True), (SEED + 1, False)]:
        code, again = train_recording(bundle, data, tmp_path, "--max-steps", 1, "--seed", seed)
        assert code == 0 and np.array_equal(again[0][0], steps[0][0]) == same


def test_loss_curve_and_weights_match_torch_optim_on_the_same_windows(trained, bundle):
    steps, _, out = trained
    model = llama()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in TRAINABLE)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=WEIGHT_DECAY)
    want = []
    for inputs, target, _ in steps:
        optimizer.zero_grad()
        loss = token_cross_entropy(model(torch.from_numpy(inputs).long()), torch.from_numpy(target))
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    np.testing.assert_allclose([loss for _, _, loss in steps], want, rtol=1e-4)
    assert want[-1] < want[0]
    tuned = load_file(out / "tuned.safetensors")
    for name, value in model.state_dict().items():
        assert_close_to_norm(tuned[name].numpy(), value.numpy(), 1e-4, name)
    frozen = llama().state_dict()
    assert all(torch.equal(tuned[name], frozen[name]) for name in frozen if name not in TRAINABLE)


def test_epochs_report_validation_loss_and_tokens_per_second(trained):
    _, stdout, out = trained
    epochs = [line for line in stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == EPOCHS and all(line.endswith(" tokens/s") for line in epochs), stdout
    assert "tokens in this run, " in stdout and "tokens/s); tuned weights in" in stdout
    model = llama()
    model.load_state_dict(load_file(out / "tuned.safetensors"))
    windows = (len(VAL) - 1) // SEQ // BATCH * BATCH  # full batches, in order
    x = np.stack([VAL[i * SEQ : (i + 1) * SEQ] for i in range(windows)])
    y = np.stack([VAL[i * SEQ + 1 : (i + 1) * SEQ + 1] for i in range(windows)])
    with torch.no_grad():
        want = np.mean(
            [
                token_cross_entropy(model(torch.from_numpy(x[i : i + BATCH])), torch.from_numpy(y[i : i + BATCH]))
                for i in range(0, windows, BATCH)
            ]
        )
    reported = float(epochs[-1].split("val_loss ")[1].split(",")[0])
    assert reported == pytest.approx(want, abs=1e-4)


def torch_greedy(model, prompt: str, length: int) -> str:
    """Greedy decoding with PyTorch, one growing sequence (no fixed window)."""
    ids = list(encode(prompt))
    with torch.no_grad():
        for _ in range(length):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return decode(ids[-length:])


@pytest.mark.parametrize("weights", ["random", "fine-tuned"])
def test_greedy_completion_through_the_compiled_forward_matches_torch(trained, bundle, weights):
    _, _, out = trained
    model, trainer = llama(), Trainer.from_bundle(bundle)
    if weights == "random":  # larger than LLaMA's initialisation, so that each position's argmax is clear
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.5)
        # the parameters only: the RoPE tables (buffers) stay the bundle's
        trainer.load_state_dict({name: p.detach().numpy() for name, p in model.named_parameters()}, strict=False)
    else:  # as examples/llama_text.py does: the checkpoint's weights on the trainer
        model.load_state_dict(load_file(out / "tuned.safetensors"))
        trainer.load_state_dict(load_checkpoint(out / "run.ckpt", load_bundle(bundle)).state_dict)
    prompt, length = "def ", SEQ - 4
    completion = greedy_completion(trainer.evaluate, prompt, (BATCH, SEQ), length)
    assert completion == torch_greedy(model, prompt, length)
    if weights == "random":
        assert len(set(completion)) > 3  # a sequence of choices, not one character repeated


@pytest.fixture(scope="module")
def classifier_bundle(tmp_path_factory):
    """A bundle that is not a next-token model: 4 float features -> one of 3 classes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.zeros(BATCH, 4), torch.zeros(BATCH, dtype=torch.long)
    program = pock.compile_training(model, x, y, functions="all")
    return write_bundle(
        program,
        tmp_path_factory.mktemp("classifier") / "bundle",
        example_inputs=x,
        example_target=y,
        loss="cross_entropy",
    )


def refused(bundle, path, tmp_path, capsys) -> str:
    """pock-train's error message for `path`, having checked it wrote nothing."""
    export, checkpoint = tmp_path / "tuned.safetensors", tmp_path / "c.ckpt"
    assert (
        pock_train.main([str(bundle), "--data", str(path), "--checkpoint", str(checkpoint), "--export", str(export)])
        == 1
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert not export.exists() and not checkpoint.exists()
    return err


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            dict(tokens_train=TRAIN[:SEQ]),
            "tokens_train has 16 tokens, shorter than one window: the bundle trains on "
            "windows of 16 tokens, each with the token after it as target (17 tokens)",
        ),
        (
            dict(tokens_train=TRAIN[: SEQ * BATCH]),
            "tokens_train has 64 tokens, 3 window(s) of 16: fewer than one batch (4 windows, 65 tokens)",
        ),
        (dict(tokens_train=TRAIN[:320].reshape(20, SEQ)), "tokens_train has shape (20, 16); a token stream is 1-D"),
        (dict(tokens_train=TRAIN.astype(np.float32)), "tokens_train has dtype float32; token ids are integers"),
        (dict(tokens_train=TRAIN, tokens_val=VAL + VOCAB), "; the model's vocabulary is 0 to 127"),
        (dict(tokens_train=TRAIN, x_train=TRAIN), "holds both a token stream (tokens_train) and samples (x_train)"),
        (dict(tokens_val=VAL), "holds tokens_val but no tokens_train"),
    ],
    ids=[
        "shorter than a window",
        "fewer than a batch",
        "not 1-D",
        "not integers",
        "outside the vocabulary",
        "mixed with samples",
        "no training text",
    ],
)
def test_token_data_that_does_not_fit_is_refused(bundle, tmp_path, capsys, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    assert message in refused(bundle, tmp_path / "bad.npz", tmp_path, capsys)


def test_a_token_stream_needs_a_next_token_model(classifier_bundle, data, tmp_path, capsys):
    err = refused(classifier_bundle, data, tmp_path, capsys)
    assert "holds a token stream (tokens_train), which trains next-token models" in err
    assert "is not one: it takes input0 (4, 4) float32 and target (4,) int32. Give it x_train and y_train" in err
