"""compile_training(..., weights=DIR): a decoder built on the meta device starts from a Hugging Face
checkpoint directory (sharded safetensors, float32 or bfloat16) and trains as torch.optim does on the
same weights; files that do not fit the model are refused with one line naming the tensor."""

import copy

import numpy as np
import pytest
import torch
import transformers
from oracle import assert_trajectory_close
from safetensors.torch import save_file

import pock_mlir as pock
from pock_mlir.frontend import Rewrites
from pock_mlir.layers import frozen_weights
from pock_mlir.quantize import QuantizedWeight
from pock_mlir.sparse import resolve_sparse
from pock_mlir.weights import Weights

CONFIG = transformers.LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=16,
    use_cache=False,
    tie_word_embeddings=True,
)
BATCH, SEQ, STEPS = 2, 8, 3


def token_loss(output, target):
    return torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def meta_model():
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(CONFIG)


@pytest.fixture(scope="module")
def pretrained():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(CONFIG)


@pytest.fixture(scope="module")
def checkpoints(pretrained, tmp_path_factory):
    """The model saved as Hugging Face does, in shards of 20 KB: in float32 and in bfloat16."""
    root = tmp_path_factory.mktemp("checkpoints")
    pretrained.save_pretrained(root / "float32", max_shard_size="20KB")
    copy.deepcopy(pretrained).to(torch.bfloat16).save_pretrained(root / "bfloat16", max_shard_size="20KB")
    return root


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ + 1), generator=generator)
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


# SGD rather than Adam: Adam moves each element by about lr whatever its gradient's size, and an
# element whose gradient is at float32 rounding level (3.6e-8 in the bfloat16 files' q_proj, against
# a median of 7e-5) moves either way with the order of a sum
OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)


def assert_trains_as_torch_optim(trainer, oracle, inputs, target, what):
    losses = [trainer.step(inputs, target) for _ in range(STEPS)]
    state = trainer.state_dict()
    assert np.array_equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied, as in HF
    assert_trajectory_close(losses, state, oracle, inputs, target, OPTIMIZER, STEPS, loss=token_loss, what=what)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_meta_model_trains_from_sharded_checkpoint_files_as_torch_optim(pretrained, checkpoints, batch, dtype):
    directory = checkpoints / dtype
    assert len(list(directory.glob("model-*-of-*.safetensors"))) > 1
    model = meta_model()
    program = pock.compile_training(model, *batch, loss=token_loss, optimizer=OPTIMIZER, weights=directory)
    assert all(p.is_meta for p in model.parameters())  # nothing was materialized into the model
    oracle = copy.deepcopy(pretrained).to(getattr(torch, dtype)).float()  # bfloat16 values upcast
    assert_trains_as_torch_optim(program.trainer(), oracle, *batch, what=f"{dtype} files")


def test_int8_weights_are_quantized_tensor_by_tensor_from_the_files(pretrained, checkpoints):
    model = meta_model()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    scheme = resolve_sparse({"quantize": {"frozen": "int8"}, "model.norm": "full"}, model, shapes)
    quantized = frozen_weights(model, scheme.policies)
    assert quantized
    initial = Weights(checkpoints / "float32", model).initial_params(Rewrites(quantized=tuple(quantized)))
    weights = dict(pretrained.named_parameters())
    for weight in quantized:
        want = QuantizedWeight.quantize(weight, weights[weight.weight].detach().numpy())
        for name in (weight.values, weight.scale):
            np.testing.assert_array_equal(initial[name], want[name])
    assert set(initial) >= {"model.norm.weight", "model.embed_tokens.weight"}


def _single_file(pretrained, path, change):
    state = {k: v.detach().clone() for k, v in pretrained.state_dict().items() if k != "lm_head.weight"}
    change(state)
    save_file(state, path)
    return path


def _drop(state):
    del state["model.layers.1.mlp.up_proj.weight"]


def _reshape(state):
    state["model.norm.weight"] = torch.ones(31)


def _add(state):
    state["model.layers.2.mlp.up_proj.weight"] = torch.ones(64, 32)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda state: None, None),
        (_drop, "the files hold no tensor model.layers.1.mlp.up_proj.weight"),
        (_reshape, "model.norm.weight has shape (31,), the model's is (32,)"),
        (_add, "model.layers.2.mlp.up_proj.weight is not a tensor of the model"),
    ],
)
def test_files_that_do_not_fit_the_model_are_named_before_any_work(pretrained, batch, tmp_path, change, message):
    path = _single_file(pretrained, tmp_path / "one.safetensors", change)
    if message is None:  # the same file unchanged fits (lm_head.weight, tied, is absent as HF saves it)
        Weights(path, meta_model())
        return
    with pytest.raises(pock.WeightsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pock.compile_training(meta_model(), batch[0], batch[1], loss=token_loss, weights=path)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent", "no such file or directory"),
        (lambda d: d, "holds model.safetensors or model.safetensors.index.json, this one neither"),
        (lambda d: d / "config.json", "not a .safetensors file"),
    ],
)
def test_a_wrong_path_is_named(batch, tmp_path, make, message):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(pock.WeightsError, match=message):
        pock.compile_training(meta_model(), batch[0], batch[1], loss=token_loss, weights=make(tmp_path))
