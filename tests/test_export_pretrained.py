"""Trainer.export_pretrained (#62): the tuned model as a Hugging Face directory that
transformers' from_pretrained loads, with transformers and PEFT as the oracles: the loaded model's
logits equal the trained program's evaluate() and those of the same model trained by torch.optim;
sharded files load as one; LoRA adapters merged, or as PEFT adapters that PeftModel loads; int8
and int4 bases dequantized; pock-train --export-pretrained; directories that are not exports are
refused. One tiny LLaMA (width 32, 2 layers) compiled three times (full, LoRA over int8 and over
int4), shared by module fixtures."""

import json

import numpy as np
import pytest
import tiny_llm
import torch
from docs_blocks import doc_python
from oracle import assert_trajectory_close
from safetensors import safe_open
from tiny_llm import SEQ, VOCAB, next_token_loss

import pock_mlir as pock
from pock_mlir.files import OutputError
from pock_mlir.runtime.export import INDEX, WEIGHTS, ExportError

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

STEPS = 3
OPTIMIZER = pock.AdamW(lr=0.01)
LORA = {"model.layers.*.self_attn.*_proj": "lora:r=4,alpha=8", "*norm": "full"}


def llama():
    return tiny_llm.llama().eval()


def llama_with(state):
    model = llama()
    model.load_state_dict(state)
    return model.eval()


def token_batch():
    ids = torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return ids[:, :-1], ids[:, 1:]


def logits(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(x).logits.numpy()


def saved_keys(tmp_path) -> list[str]:
    """The oracle of an export's keys: those save_pretrained writes of the model (a tied weight once)."""
    llama().save_pretrained(tmp_path / "save_pretrained")
    with safe_open(tmp_path / "save_pretrained" / WEIGHTS, "np") as f:
        return sorted(f.keys())


def trained(program, x, y):
    """A trainer of `program` after STEPS steps on the batch, and their losses."""
    trainer = program.trainer()
    return trainer, [trainer.step(x, y) for _ in range(STEPS)]


@pytest.fixture(scope="module")
def full():
    """A fully trained LLaMA: its program (one module of every function, as a bundle holds it), a
    trainer after STEPS AdamW steps on one batch and their losses."""
    x, y = token_batch()
    program = pock.compile_training(llama(), x, y, loss=next_token_loss, optimizer=OPTIMIZER, functions="all")
    return program, *trained(program, x, y)


@pytest.fixture(scope="module", params=["int8", "int4:group=16"])
def qlora(request):
    """LoRA on the attention projections over an int8 or int4 base (int4 holds the tied embedding
    and head too), the norms in full."""
    x, y = token_batch()
    sparse = {"quantize": {"frozen": request.param}, **LORA}
    program = pock.compile_training(llama(), x, y, loss=next_token_loss, optimizer=OPTIMIZER, sparse=sparse)
    return trained(program, x, y)[0]


def test_the_export_loads_with_from_pretrained_and_equals_evaluate_and_torch_optim(full, tmp_path):
    program, trainer, losses = full
    x, y = token_batch()
    exported = trainer.export_pretrained(tmp_path / "tuned")
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "generation_config.json", WEIGHTS]
    with safe_open(exported / WEIGHTS, "np") as f:
        written = sorted(f.keys())
    assert written == saved_keys(tmp_path) and "lm_head.weight" not in written  # model.embed_tokens.weight's
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    assert type(loaded) is transformers.LlamaForCausalLM and loaded.dtype == torch.float32
    np.testing.assert_allclose(logits(loaded, x), trainer.evaluate(x), rtol=1e-5, atol=1e-5)
    state = {key: value.numpy() for key, value in loaded.state_dict().items()}
    tuned = trainer.state_dict()  # the tied key too, from_pretrained tying it again
    assert sorted(state) == sorted(tuned) and "lm_head.weight" in state
    for key, value in tuned.items():
        np.testing.assert_array_equal(state[key], value, err_msg=key)
    # the oracle: the loaded weights are those of the same steps by torch.optim
    assert_trajectory_close(losses, state, llama(), x, y, OPTIMIZER, STEPS, loss=next_token_loss, what="exported")
    assert not np.allclose(logits(loaded, x), logits(llama(), x), atol=1e-3)  # trained
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"


def test_a_sharded_export_loads_as_one(full, tmp_path):
    _, trainer, _ = full
    x, _ = token_batch()
    exported = trainer.export_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((exported / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(p.name for p in exported.glob("model-*.safetensors"))
    assert not (exported / WEIGHTS).exists()
    sizes = {}
    for key, file in index["weight_map"].items():
        sizes.setdefault(file, []).append(trainer.state_dict()[key].nbytes)
    # save_pretrained's rule: a file closes before the tensor that would take it over the limit
    assert all(sum(s) <= 20_000 or len(s) == 1 for s in sizes.values())
    assert sorted(index["weight_map"]) == saved_keys(tmp_path)
    merged = trainer.merged_state_dict()
    assert index["metadata"]["total_size"] == sum(merged[key].nbytes for key in index["weight_map"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    np.testing.assert_allclose(logits(loaded, x), trainer.evaluate(x), rtol=1e-5, atol=1e-5)


def test_lora_merged_over_a_quantized_base_equals_evaluate(qlora, tmp_path):
    x, _ = token_batch()
    exported = qlora.export_pretrained(tmp_path / "merged")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    np.testing.assert_allclose(logits(loaded, x), qlora.evaluate(x), rtol=1e-5, atol=1e-5)
    merged = qlora.merged_state_dict()  # the quantized weights dequantized, the adapters merged
    assert sorted(loaded.state_dict()) == sorted(merged)
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), merged[key], err_msg=key)


def test_lora_as_peft_adapters_loads_with_peft_and_with_from_pretrained(qlora, tmp_path):
    x, _ = token_batch()
    exported = qlora.export_pretrained(tmp_path / "peft", lora="peft")
    assert {"adapter_config.json", "adapter_model.safetensors", WEIGHTS} <= {p.name for p in exported.iterdir()}
    # the oracle: PEFT's LoRA layers over the base the directory holds (the dequantized int8 or int4 weights)
    from safetensors.torch import load_file

    base = llama()
    missing, unexpected = base.load_state_dict(load_file(exported / WEIGHTS), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied: it is model.embed_tokens.weight
    adapted = peft.PeftModel.from_pretrained(llama_with(base.state_dict()), exported).eval()
    np.testing.assert_allclose(logits(adapted, x), qlora.evaluate(x), rtol=1e-4, atol=1e-5)
    assert not np.allclose(logits(base, x), qlora.evaluate(x), atol=1e-3)  # the adapters count
    # transformers loads the adapters embedded beside the base on its own
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
    np.testing.assert_allclose(logits(loaded, x), qlora.evaluate(x), rtol=1e-4, atol=1e-5)


def test_an_export_replaces_an_earlier_one_and_refuses_anything_else(full, tmp_path):
    _, trainer, _ = full
    target = tmp_path / "out"
    trainer.export_pretrained(target, max_shard_size="20KB")
    trainer.export_pretrained(target)  # an earlier export: replaced whole
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json", WEIGHTS]
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.json").write_text("{}")  # someone's model, not an export
    with pytest.raises(OutputError, match="not an earlier export"):
        trainer.export_pretrained(own)
    assert [p.name for p in own.iterdir()] == ["config.json"]
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="not a directory"):
        trainer.export_pretrained(tmp_path / "file")
    with pytest.raises(ExportError, match="max_shard_size"):
        trainer.export_pretrained(tmp_path / "new", max_shard_size="lots")
    with pytest.raises(ExportError, match="'merge'"):
        trainer.export_pretrained(tmp_path / "new", lora="fold")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "out", "own"]  # no staging left behind


def test_pock_train_exports_a_bundle_as_a_pretrained_directory(full, tmp_path, capsys):
    """The bundle carries the model's config (hf/); pock-train --export-pretrained writes the weights
    --export writes, as a directory from_pretrained loads; a directory that is not an export is
    refused before training, in one line."""
    from safetensors.numpy import load_file

    from pock_mlir.bundle import write_bundle
    from pock_mlir.runtime.bundle import load_bundle
    from pock_mlir.tools import pock_train

    program, _, _ = full
    x, y = token_batch()
    bundle = write_bundle(program, tmp_path / "bundle", example_inputs=x, example_target=y, loss=next_token_loss)
    assert load_bundle(bundle).hf_files == program.hf_files
    assert json.loads((bundle / "hf" / "config.json").read_text())["model_type"] == "llama"
    tokens = np.random.default_rng(0).integers(0, VOCAB, 4 * SEQ + 1)
    np.savez(tmp_path / "text.npz", tokens_train=tokens)

    def train(*extra) -> int:
        return pock_train.main(
            [str(bundle), "--data", str(tmp_path / "text.npz"), "--max-steps", "2", *map(str, extra)]
        )

    exported, state = tmp_path / "hf", tmp_path / "tuned.safetensors"
    assert train("--export", state, "--export-pretrained", exported, "--max-shard-size", "30KB") == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert (exported / INDEX).is_file()
    expected = load_file(state)
    assert sorted(loaded.state_dict()) == sorted(expected)
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), expected[key], err_msg=key)

    capsys.readouterr()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert train("--export", tmp_path / "t2.safetensors", "--export-pretrained", tmp_path / "notes") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not an earlier export" in err and not (tmp_path / "t2.safetensors").exists()
    assert train("--export", tmp_path / "t2.safetensors", "--export-lora", "peft") == 1
    assert "need --export-pretrained" in capsys.readouterr().err
    # a bundle without the config (written before bundles carried it): still trains, cannot export so
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["hf_files"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert load_bundle(bundle).hf_files == {}
    assert train("--export", tmp_path / "t3.safetensors", "--export-pretrained", tmp_path / "new") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "without a Hugging Face config" in err and not (tmp_path / "new").exists()


def test_the_guides_block_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(
        compile(doc_python("docs/llm-fine-tuning.md", "## Exporting the tuned model"), "llm-fine-tuning.md", "exec"), {}
    )
    assert (tmp_path / "llama-tuned" / WEIGHTS).is_file() and (tmp_path / "llama-peft" / INDEX).is_file()
    assert (tmp_path / "llama-peft" / "adapter_config.json").is_file()
