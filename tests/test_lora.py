"""LoRA adapters as an update policy (#22), with PEFT as the oracle: the same model wrapped by
`peft.get_peft_model` with the same adapter values gives the reference gradients, and
torch.optim.AdamW on PEFT's trainable parameters the reference trajectory. Adapters exported by
pock-mlir load into `peft.PeftModel.from_pretrained`, and the merged weights equal PEFT's
merge_and_unload. Each model compiles once (module fixture)."""

import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_gradients_close, torch_gradients, torch_trajectory
from tiny_llm import SEQ, VOCAB, llama, next_token_loss

import pock_mlir as pock
from pock_mlir import layers, lora
from pock_mlir.sparse import SparseConfigError, lora_adapters, resolve_sparse

peft = pytest.importorskip("peft")  # in the dev extras; `make test` installs it
transformers = pytest.importorskip("transformers")

OPTIMIZER = pock.AdamW(lr=0.01)
STEPS = 20


def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
        )
    ).eval()


class PointwiseCNN(nn.Module):
    """MobileNet-like: a 3x3 stem, an expand 1x1, a depthwise 3x3, a project 1x1, a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.expand = nn.Conv2d(8, 16, 1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.project = nn.Conv2d(16, 8, 1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = F.silu(self.stem(x))
        x = x + self.project(F.silu(self.depthwise(F.silu(self.expand(x)))))
        return self.head(x.mean((2, 3)))


def cnn():
    torch.manual_seed(0)
    return PointwiseCNN()


def token_batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def image_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 5, (4,), generator=g)


# name: (model, batch, loss, pock-mlir's scheme, the same adapters as PEFT's LoraConfig)
CASES = {
    # LoRA on the attention projections; the norms train in full (PEFT: modules_to_save)
    "hf-llama": (
        llama,
        token_batch,
        next_token_loss,
        {"model.layers.*.self_attn.*_proj": {"lora": {"r": 4, "alpha": 8}}, "*norm": "full"},
        dict(
            r=4,
            lora_alpha=8,
            target_modules=[f"layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"],
            modules_to_save=["input_layernorm", "post_attention_layernorm", "model.norm"],
        ),
    ),
    # Hugging Face Conv1D (weights stored [in, out]): the fused QKV and the first FFN layer
    "hf-gpt2": (
        gpt2,
        token_batch,
        next_token_loss,
        {"*.c_attn": "lora:r=4,alpha=16", "*.mlp.c_fc": "lora:r=2,alpha=4"},
        dict(
            r=4,
            lora_alpha=16,
            target_modules=["c_attn", "c_fc"],
            rank_pattern={"c_fc": 2},
            alpha_pattern={"c_fc": 4},
            fan_in_fan_out=True,
        ),
    ),
    # QLoRA-style: the same LLaMA scheme over an int8 frozen base (PEFT's base: the dequantized weights)
    "hf-llama-int8": (
        llama,
        token_batch,
        next_token_loss,
        {"quantize": {"frozen": "int8"}, "model.layers.*.self_attn.*_proj": "lora:r=4,alpha=8", "*norm": "full"},
        dict(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            modules_to_save=["input_layernorm", "post_attention_layernorm", "model.norm"],
        ),
    ),
    # 1x1 convs, a 3x3 conv (PEFT's A takes the base kernel, B is 1x1) and a linear; one module full
    "cnn": (
        cnn,
        image_batch,
        "cross_entropy",
        {
            "expand": "lora:r=2",
            "project": "lora:r=2",
            "stem": "lora:r=3,alpha=6",
            "head": {"lora": {"r": 2, "alpha": 2}},
            "depthwise": "full",
        },
        dict(
            r=2,
            lora_alpha=8,
            target_modules=["expand", "project", "stem", "head"],
            rank_pattern={"stem": 3},
            alpha_pattern={"stem": 6, "head": 2},
            modules_to_save=["depthwise"],
        ),
    ),
}


def ours(peft_name: str) -> str:
    """A PEFT parameter's name in pock-mlir's program."""
    name = peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.default.", f".{part}.")
    return name.replace(".modules_to_save.default.", ".")


def int8_base(model, quantized_layers: list[str]):
    """A copy of `model` whose weights in `quantized_layers` are what int8 holds of them: per
    output channel, scale = max |W| / 127, W = round(W / scale) * scale (Conv1D: columns)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name in quantized_layers:
            module = model.get_submodule(name)
            weight = module.weight
            channels = 1 if type(module).__name__ == "Conv1D" else 0
            others = [d for d in range(weight.dim()) if d != channels]
            scale = weight.abs().amax(dim=others, keepdim=True) / 127
            weight.copy_(torch.round(weight / scale).clamp(-127, 127) * scale)
    return model


def peft_twin(model, config: dict, state: dict):
    """PEFT's LoRA model over a copy of `model`, its adapters set to pock-mlir's values; returns it
    and its trainable parameters' names (PEFT's own choice of what trains)."""
    twin = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(**config))
    trainable = [n for n, p in twin.named_parameters() if p.requires_grad]
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.from_numpy(state[ours(name)]))
    return twin, trainable


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    """The compiled program, its starting state and PEFT's twin of it."""
    make, batch, loss, scheme, config = CASES[request.param]
    model, (x, y) = make(), batch()
    program = pock.compile_training(
        model, x, y, loss=loss, optimizer=OPTIMIZER, sparse=scheme, functions=("step", "gradients")
    )  # one IREE module for both
    # B starts at zero (PEFT's init), where A's gradient vanishes: give B values so both are checked.
    g = np.random.default_rng(0)
    start = {
        **program.initial_params,
        **{a.b: (0.1 * g.standard_normal(a.b_shape)).astype(np.float32) for a in program.signature.adapters},
    }
    base = int8_base(model, [w.module for w in program.signature.quantized])
    twin, peft_trainable = peft_twin(base, config, start)
    return SimpleNamespace(
        name=request.param,
        base=base,
        x=x,
        y=y,
        loss=loss,
        program=program,
        start=start,
        twin=twin,
        peft_trainable=peft_trainable,
    )


def started(case):
    trainer = case.program.trainer()
    trainer.load_state_dict(case.start, strict=False)
    return trainer


def test_the_scheme_trains_what_peft_trains(case):
    signature = case.program.signature
    assert sorted(signature.trainable) == sorted({ours(n) for n in case.peft_trainable})
    frozen = [p.name for p in signature.params if p.name not in signature.trainable]
    assert all(".lora_" not in name for name in frozen)
    int8 = {w.weight for w in signature.quantized}  # stored as int8 values and scales, frozen too
    assert {a.weight for a in signature.adapters} - int8 <= set(frozen)  # the base weights freeze


def test_an_int8_base_holds_every_frozen_layer_weight_but_tied_ones(case):
    """Under `quantize: {frozen: int8}` each frozen linear weight is an int8 parameter with a
    float32 scale per output channel; the tied LM head stays float32 (the embedding shares it)."""
    signature = case.program.signature
    specs = {p.name: p for p in signature.params}
    if case.name != "hf-llama-int8":
        assert not signature.quantized
        return
    linears = [n for n, m in case.base.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    assert [w.module for w in signature.quantized] == linears
    for w in signature.quantized:
        assert w.weight not in specs and specs[w.values].dtype == "int8" and specs[w.values].shape == w.weight_shape
        assert specs[w.scale].dtype == "float32" and specs[w.scale].shape == (w.weight_shape[0],)
    assert specs["lm_head.weight" if "lm_head.weight" in specs else "model.embed_tokens.weight"].dtype == "float32"


def test_adapters_start_as_peft_initialises_them(case):
    """A Kaiming-uniform (a = sqrt(5)) within PEFT's bound 1/sqrt(fan_in), B zero; reproducible."""
    program = case.program
    for adapter in program.signature.adapters:
        a, b = program.initial_params[adapter.a], program.initial_params[adapter.b]
        fan_in = int(np.prod(adapter.a_shape[1:]))
        assert a.shape == adapter.a_shape and 0.5 / np.sqrt(fan_in) < np.abs(a).max() <= 1 / np.sqrt(fan_in)
        assert b.shape == adapter.b_shape and not b.any()
    again = layers.initial_adapter_values(program.signature.adapters)
    assert all(np.array_equal(v, program.initial_params[n]) for n, v in again.items())


def test_gradients_match_peft(case):
    value, grads = started(case).gradients(case.x, case.y)
    want_loss, want = torch_gradients(case.twin, case.x, case.y, case.loss, trainable=case.peft_trainable)
    assert value == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, {ours(n): g for n, g in want.items()}, what=f"{case.name} gradient")


def test_twenty_adamw_steps_match_peft(case):
    """20 AdamW steps against torch.optim on PEFT's model in float64; each value may stray by
    1e-4 or 10x PEFT float32's own distance from float64 (the suite's trajectory bound)."""
    trainer = started(case)
    losses = [trainer.step(case.x, case.y) for _ in range(STEPS)]
    state = trainer.state_dict()
    args = (case.twin, case.x, case.y, OPTIMIZER, STEPS, case.loss, case.peft_trainable)
    want_losses, want = torch_trajectory(*args, float64=True)
    f32_losses, f32 = torch_trajectory(*args)
    for step, (got, w, f) in enumerate(zip(losses, want_losses, f32_losses), 1):
        assert abs(got - w) <= max(1e-4 * abs(w), 10 * abs(f - w)), f"{case.name} loss at step {step}: {got} vs {w}"
    assert losses[-1] < losses[0]
    trained = {ours(n): want[n] for n in case.peft_trainable}
    strays = {ours(n): 10 * np.linalg.norm(f32[n] - want[n]) for n in case.peft_trainable}
    assert_gradients_close(
        {n: state[n] for n in trained}, trained, what=f"{case.name} after {STEPS} steps", allowed=strays
    )
    signature = case.program.signature
    assert all(
        np.array_equal(state[p.name], case.start[p.name]) for p in signature.params if p.name not in signature.trainable
    )


def test_exported_adapters_load_into_peft_and_merge_as_peft_merges(case, tmp_path):
    """export_adapters -> PeftModel.from_pretrained gives evaluate's output; merged_state_dict
    equals PEFT's merge_and_unload of the same adapters."""
    trainer = started(case)
    trainer.step(case.x, case.y)  # trained values, not the initial ones
    trainer.export_adapters(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(case.base), tmp_path / "adapter").eval()
    with torch.no_grad():
        out = loaded(case.x)
    out = out.logits if hasattr(out, "logits") else out
    np.testing.assert_allclose(trainer.evaluate(case.x), out.numpy(), rtol=1e-4, atol=1e-5)
    merged = trainer.merged_state_dict()
    assert not any(".lora_" in n for n in merged)
    for n, p in loaded.merge_and_unload().named_parameters():
        np.testing.assert_allclose(merged[n], p.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{case.name}: {n}")


# -- the scheme's format and its errors (no compilation) ------------------------------------


def _resolve(model, sparse):
    adapters = lora_adapters(sparse, model)
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    params.update({n: v.shape for n, v in layers.initial_adapter_values(adapters).items()})
    return adapters, resolve_sparse(sparse, model, params)


def test_a_peft_model_as_it_is_trains_its_adapters_only_as_peft_with_torch_optim():
    """A model the user wrapped with peft.get_peft_model compiles without a scheme: PEFT froze the
    base (requires_grad=False), so only the adapters train, and ten AdamW steps follow torch.optim
    on PEFT's trainable parameters."""
    model = peft.get_peft_model(
        cnn(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["expand", "head"], init_lora_weights=False)
    )
    x, y = image_batch()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    trainer = pock.compile_training(model, x, y, optimizer=OPTIMIZER, functions=("step",)).trainer()
    losses = [trainer.step(x, y) for _ in range(10)]
    want_losses, want = torch_trajectory(model, x, y, OPTIMIZER, 10, trainable=trainable)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    state = trainer.state_dict()
    assert {n for n in state if not np.array_equal(state[n], model.state_dict()[n].numpy())} == trainable
    assert_gradients_close({n: state[n] for n in trainable}, {n: want[n] for n in trainable}, what="adapters")


def test_lora_combines_with_later_patterns_and_names_modules_by_weight_or_container():
    adapters, scheme = _resolve(cnn(), {"stem.weight": "lora", "*": "bias", "head": "lora:r=1,alpha=3"})
    assert [(a.module, a.kind, a.r, a.alpha) for a in adapters] == [
        ("stem", "conv", 8, 8.0),
        ("head", "linear", 1, 3.0),
    ]
    kinds = {n: p.kind for n, p in scheme.policies.items()}
    # "*": bias, after stem's LoRA, trains every bias (stem's too) but freezes stem's adapter
    assert kinds["stem.bias"] == "full" and kinds["stem.lora_A.weight"] == "frozen" and kinds["stem.weight"] == "frozen"
    assert kinds["head.lora_B.weight"] == "full" and kinds["head.weight"] == "frozen" and kinds["head.bias"] == "frozen"
    adapters, _ = _resolve(llama(), {"model.layers.1": "lora"})  # a block: every linear inside it
    assert [a.module.removeprefix("model.layers.1.") for a in adapters] == [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]


@pytest.mark.parametrize(
    "sparse, message",
    [
        (
            {"depthwise": "lora"},
            "pattern 'depthwise': LoRA applies to nn.Linear, Hugging Face Conv1D and ungrouped "
            "nn.Conv2d, and the pattern names depthwise (Conv2d)",
        ),
        ({"head": "lora:r=0"}, "LoRA needs r >= 1 and alpha > 0, got r=0"),
        ({"head": "lora:rank=4"}, "unknown LoRA option(s) rank; options are r, alpha, seed"),
        ({"head": "lora:4"}, "write lora:r=8,alpha=16"),
        ({"head": {"lora": {"r": "x"}}}, "LoRA r and seed must be integers"),
        ({"default": "lora"}, "default: LoRA is a policy for patterns"),
    ],
)
def test_bad_lora_policies_are_one_clear_error(sparse, message):
    with pytest.raises(SparseConfigError) as e:
        _resolve(cnn(), sparse)
    assert message in str(e.value)


def test_a_wildcard_lora_pattern_that_adapts_nothing_is_a_warning():
    adapters, scheme = _resolve(cnn(), {"*.q_proj": "lora", "head": "lora"})
    assert [a.module for a in adapters] == ["head"] and scheme.unmatched == ["*.q_proj"]


def test_lora_on_bare_ir_needs_the_model():
    with pytest.raises(SparseConfigError, match="LoRA policies add adapters to the PyTorch model"):
        lora_adapters({"fc": "lora"}, None)


def test_peft_cannot_hold_a_trained_tensor_inside_an_adapted_module():
    adapters, scheme = _resolve(cnn(), {"head": "lora", "head.bias": "full"})
    trainable = [n for n, p in scheme.policies.items() if p.kind != "frozen"]
    with pytest.raises(lora.LoraError, match="trains head.bias, in an adapted module"):
        lora.check_exportable(list(scheme.policies), adapters, trainable)


# -- the bundle: pock-compile, pock-train --export-adapters, checkpoints -------------------

MODEL_FILE = """
import torch
from test_lora_model import PointwiseCNN

def model():
    torch.manual_seed(0)
    return PointwiseCNN()

def example_batch():
    return torch.zeros(4, 3, 12, 12), torch.zeros(4, dtype=torch.int64)
"""

SCHEME = """
expand: lora:r=2,alpha=4
project: {lora: {r: 2, alpha: 4}}
head: full
"""


def test_pock_train_exports_adapters_that_peft_loads_and_resumes_them(tmp_path, monkeypatch, capsys):
    """A LoRA bundle: --export writes the merged weights (they load strictly into the model),
    --export-adapters the PEFT adapter, and both give the same outputs; 2 + 2 steps resumed from
    a checkpoint export exactly what 4 steps straight do."""
    import inspect

    from safetensors.torch import load_file

    from pock_mlir.tools import pock_compile, pock_train

    (tmp_path / "test_lora_model.py").write_text(
        "import torch, torch.nn as nn, torch.nn.functional as F\n\n" + inspect.getsource(PointwiseCNN)
    )
    (tmp_path / "cnn_model.py").write_text(MODEL_FILE)
    (tmp_path / "lora.yaml").write_text(SCHEME)
    monkeypatch.syspath_prepend(str(tmp_path))
    bundle = tmp_path / "bundle"
    assert (
        pock_compile.main(
            [
                str(tmp_path / "cnn_model.py"),
                "--sparse",
                str(tmp_path / "lora.yaml"),
                "--optimizer",
                "adamw:lr=0.01",
                "-o",
                str(bundle),
            ]
        )
        == 0
    )
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [a["module"] for a in manifest["lora"]] == ["expand", "project"]
    g = np.random.default_rng(0)
    x, y = image_batch()
    np.savez(
        tmp_path / "data.npz",
        x_train=g.standard_normal((16, 3, 12, 12)).astype(np.float32),
        y_train=g.integers(0, 5, 16),
    )

    def train(*extra):
        return pock_train.main([str(bundle), "--data", str(tmp_path / "data.npz"), "--epochs", "1", *extra])

    assert (
        train(
            "--max-steps",
            "4",
            "--export",
            str(tmp_path / "straight.safetensors"),
            "--export-adapters",
            str(tmp_path / "straight"),
        )
        == 0
    )
    assert (
        train("--max-steps", "2", "--checkpoint", str(tmp_path / "ck"), "--export", str(tmp_path / "half.safetensors"))
        == 0
    )
    assert (
        train(
            "--max-steps",
            "4",
            "--checkpoint",
            str(tmp_path / "ck"),
            "--resume",
            "--export",
            str(tmp_path / "resumed.safetensors"),
            "--export-adapters",
            str(tmp_path / "resumed"),
        )
        == 0
    )
    for file in ("straight/adapter_model.safetensors", "straight/adapter_config.json"):
        assert (tmp_path / file).read_bytes() == (tmp_path / file.replace("straight", "resumed")).read_bytes()

    merged = cnn()
    merged.load_state_dict(load_file(tmp_path / "straight.safetensors"))  # strict: the model's own names
    adapted = peft.PeftModel.from_pretrained(cnn(), tmp_path / "straight").eval()
    with torch.no_grad():
        np.testing.assert_allclose(merged(x).numpy(), adapted(x).numpy(), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(merged(x), cnn()(x))  # trained

    capsys.readouterr()
    assert (
        pock_train.main(
            [
                str(bundle),
                "--data",
                str(tmp_path / "data.npz"),
                "--max-steps",
                "1",
                "--export",
                str(tmp_path / "x.safetensors"),
                "--export-adapters",
                str(tmp_path / "data.npz"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "data.npz" in err and not (tmp_path / "x.safetensors").exists()


def test_an_int8_bundle_stores_int8_and_exports_the_model_it_trains(tmp_path):
    """The bundle holds int8 values and scales (a quarter of the bytes); the exported state_dict
    loads strictly into the model and holds the dequantized weights, which reproduce evaluate."""
    from pock_mlir.bundle import write_bundle
    from pock_mlir.runtime import Trainer
    from pock_mlir.runtime.bundle import load_bundle

    model, (x, y) = cnn(), image_batch()
    program = pock.compile_training(
        model, x, y, sparse={"quantize": {"frozen": "int8"}, "head": "full"}, functions="all"
    )
    layers = ["stem", "expand", "depthwise", "project"]
    assert [w.module for w in program.signature.quantized] == layers
    write_bundle(program, tmp_path / "bundle", example_inputs=x, example_target=y, loss="cross_entropy")
    bundle = load_bundle(tmp_path / "bundle")
    stored = {n: v for n, v in bundle.initial_params.items() if n.endswith("weight_int8")}
    assert len(stored) == 4 and all(v.dtype == np.int8 for v in stored.values())
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    int8_bytes = sum(v.nbytes for v in bundle.initial_params.values())
    weight_bytes = sum(model.get_submodule(n).weight.numel() for n in layers)
    assert int8_bytes == float_bytes - 3 * weight_bytes + 4 * sum(
        model.get_submodule(n).weight.shape[0] for n in layers
    )

    trainer = Trainer.from_bundle(tmp_path / "bundle")
    trainer.step(x.numpy(), y.numpy())
    tuned = cnn()
    tuned.load_state_dict({n: torch.from_numpy(v) for n, v in trainer.merged_state_dict().items()})
    want = int8_base(model, layers)
    for n in layers:
        assert torch.equal(tuned.get_submodule(n).weight, want.get_submodule(n).weight)
    with torch.no_grad():
        np.testing.assert_allclose(trainer.evaluate(x.numpy()), tuned(x).numpy(), rtol=1e-5, atol=1e-6)


def test_an_int8_base_saves_the_float32_weights_on_the_device():
    """The int8-to-float32 cast is computed inside the matmuls (forward and input gradient), so
    the step's workspace holds no float32 copy of a weight: the device memory drops by exactly
    what the stored weights shrink (without the fusion it would hold each weight in float32)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(8, 256), torch.randint(0, 10, (8,))
    scheme = {"default": "frozen", "2": "full"}  # the backward crosses the last layer's int8 weight
    plain = pock.compile_training(model, x, y, sparse=scheme).trainer()
    int8 = pock.compile_training(model, x, y, sparse={"quantize": {"frozen": "int8"}, **scheme}).trainer()
    quantized = int8.signature.quantized
    assert [w.module for w in quantized] == ["0", "4"]
    assert int8.workspace_bytes <= plain.workspace_bytes
    shrink = sum(3 * math.prod(w.weight_shape) - 4 * w.weight_shape[0] for w in quantized)
    assert plain.device_bytes - int8.device_bytes == shrink + plain.workspace_bytes - int8.workspace_bytes


def test_quantize_takes_frozen_int8_or_int4_only():
    with pytest.raises(SparseConfigError, match=r"quantize takes \{frozen: int8\}, \{frozen: int4\}"):
        _resolve(cnn(), {"quantize": {"frozen": "int2"}})
    with pytest.raises(SparseConfigError, match=r"quantize takes \{frozen: int8\} or \{frozen: int4\}"):
        _resolve(cnn(), {"quantize": "int8"})
