"""compile_training(..., weights=DIR): a decoder built on the meta device starts from a Hugging Face
checkpoint directory (sharded safetensors, float32 or bfloat16) and trains as torch.optim does on the
same weights, through the API and through pock-compile's bundle; files that do not fit the model are
refused with one line naming the tensor."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from docs_blocks import doc_commands, doc_python
from oracle import assert_trajectory_close
from safetensors.numpy import load_file
from safetensors.torch import save_file

import pock_mlir as pock
from pock_mlir.frontend import Rewrites
from pock_mlir.layers import frozen_weights
from pock_mlir.quantize import QuantizedWeight
from pock_mlir.runtime import Trainer
from pock_mlir.sparse import resolve_sparse
from pock_mlir.tools import pock_compile
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
BATCH, SEQ, STEPS = 2, 8, 3  # the guide's


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
    """The model saved as Hugging Face does, in shards of 20 KB (the guide's test saves it in bfloat16)."""
    root = tmp_path_factory.mktemp("checkpoints")
    pretrained.save_pretrained(root / "float32", max_shard_size="20KB")
    return root


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ + 1), generator=generator)
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


# SGD rather than Adam: Adam moves each element by about lr whatever its gradient's size, and an
# element whose gradient is at float32 rounding level (3.6e-8 in the bfloat16 files' q_proj, against
# a median of 7e-5) moves either way with the order of a sum
OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)  # the guide's


def assert_trains_as_torch_optim(trainer, oracle, inputs, target, what):
    losses = [trainer.step(inputs, target) for _ in range(STEPS)]
    state = trainer.state_dict()
    assert np.array_equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # tied, as in HF
    assert_trajectory_close(losses, state, oracle, inputs, target, OPTIMIZER, STEPS, loss=token_loss, what=what)


def test_a_meta_model_trains_from_sharded_float32_files_as_torch_optim(pretrained, checkpoints, batch):
    directory = checkpoints / "float32"
    assert len(list(directory.glob("model-*-of-*.safetensors"))) > 1
    model = meta_model()
    # the guide's functions (its test below): one IREE module for both
    program = pock.compile_training(model, *batch, loss=token_loss, optimizer=OPTIMIZER, weights=directory)
    assert all(p.is_meta for p in model.parameters())  # nothing was materialized into the model
    assert_trains_as_torch_optim(program.trainer(), pretrained, *batch, what="float32 files")


def test_the_guides_checkpoint_section_trains_as_torch_optim_on_what_from_pretrained_loads(tmp_path, monkeypatch):
    """docs/llm-fine-tuning.md: the Python block (a bfloat16 checkpoint, a meta model, weights=),
    then its pock-compile command on the same directory, each trained against torch.optim on the
    model transformers' from_pretrained loads from the files in float32."""
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__main__"}
    exec(compile(doc_python("docs/llm-fine-tuning.md", "## From a checkpoint directory"), "guide", "exec"), ns)
    oracle = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tiny-llama", dtype=torch.float32).train()
    inputs, target, state = ns["inputs"], ns["target"], ns["trainer"].state_dict()
    assert ns["program"].optimizer == OPTIMIZER and len(ns["losses"]) == STEPS
    assert_trajectory_close(
        ns["losses"], state, oracle, inputs, target, OPTIMIZER, STEPS, loss=token_loss, what="guide"
    )

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for command in doc_commands("docs/llm-fine-tuning.md", "## From a checkpoint directory"):
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    held = load_file(tmp_path / "tiny-llama-bundle" / "params.safetensors")
    for name, value in oracle.state_dict().items():
        if name != "lm_head.weight":  # tied: the bundle holds the one tensor, under its first name
            np.testing.assert_array_equal(held[name], value.numpy(), err_msg=name)
    assert_trains_as_torch_optim(Trainer.from_bundle(tmp_path / "tiny-llama-bundle"), oracle, inputs, target, "bundle")


def test_a_model_files_weights_start_its_meta_model(pretrained, checkpoints, batch, tmp_path):
    """pock-compile MODEL.py whose model() is on the meta device and WEIGHTS names the files."""
    model_file = tmp_path / "model.py"
    model_file.write_text(
        textwrap.dedent(
            f"""
            import torch
            import transformers

            WEIGHTS = {str(checkpoints / "float32")!r}
            LOSS = lambda output, target: torch.nn.functional.cross_entropy(
                output.logits.flatten(0, 1), target.flatten()
            )

            def model():
                config = transformers.AutoConfig.from_pretrained(WEIGHTS)
                with torch.device("meta"):
                    return transformers.AutoModelForCausalLM.from_config(config)

            def example_batch():
                ids = torch.zeros(({BATCH}, {SEQ}), dtype=torch.int64)
                return {{"input_ids": ids}}, ids
            """
        )
    )
    bundle = tmp_path / "bundle"
    assert pock_compile.main([str(model_file), "--optimizer", "sgd:lr=0.1,momentum=0.9", "-o", str(bundle)]) == 0
    held = load_file(bundle / "params.safetensors")
    for name, value in pretrained.state_dict().items():
        if name != "lm_head.weight":
            np.testing.assert_array_equal(held[name], value.detach().numpy(), err_msg=name)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "is a directory: give --task causal-lm"),
        (["--task", "causal-lm"], "give --seq-len"),
    ],
)
def test_pock_compile_names_what_a_checkpoint_directory_lacks(checkpoints, tmp_path, capsys, argv, message):
    assert pock_compile.main([str(checkpoints / "float32"), *argv, "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("quantize", ["int8", "int4:group=16"])
def test_quantized_weights_are_quantized_tensor_by_tensor_from_the_files(pretrained, checkpoints, quantize):
    model = meta_model()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    scheme = resolve_sparse({"quantize": {"frozen": quantize}, "model.norm": "full"}, model, shapes)
    quantized = frozen_weights(model, scheme.policies, scheme.quantize)
    assert quantized
    initial = Weights(checkpoints / "float32", model).initial_params(Rewrites(quantized=tuple(quantized)))
    weights = dict(pretrained.named_parameters())
    for weight in quantized:
        want = QuantizedWeight.quantize(weight, weights[weight.weight].detach().numpy())
        for name in (weight.values, weight.scale):
            np.testing.assert_array_equal(initial[name], want[name])
    # int4 stores the (tied) embedding too; int8 keeps it float32
    unquantized = {"model.norm.weight"} | ({"model.embed_tokens.weight"} if quantize == "int8" else set())
    assert set(initial) >= unquantized
    assert not set(initial) & {w.weight for w in quantized}


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
