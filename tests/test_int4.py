"""The int4 frozen base (#62): group-wise symmetric 4-bit weights, two a byte, against a reference
written here element by element, and a tiny language model over it (an embedding tied to its
head, LoRA and a sparse update) against PyTorch autograd and torch.optim running the same
dequantized weights. One program, compiled once (module fixture)."""

import copy
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_gradients_close, torch_gradients, torch_trajectory
from pock_mlir.passes.pipeline import run_pipeline
from pock_mlir.passes.pock_backend_switch import module_weight_copies
from torch_mlir import ir

import pock_mlir as pock
from pock_mlir import quantize
from pock_mlir.context import make_context
from pock_mlir.layers import frozen_weights
from pock_mlir.quantize import QuantizedWeight, QuantizeError
from pock_mlir.sparse import SparseConfigError, resolve_sparse
from pock_mlir.tuning import MAX_WEIGHT_COPIES

VOCAB, WIDTH, HIDDEN, GROUP = 37, 32, 64, 16
OPTIMIZER = pock.AdamW(lr=0.01)
STEPS = 10


def reference_int4(weight: np.ndarray, group: int):
    """Packed bytes, scales and dequantized values of a [out, in] weight, one element at a time:
    per group of `group` inputs scale = max |w| / 7 (1 if all zero), q = round(w / scale) in
    [-7, 7], stored as q + 8, column 2j in byte j's low nibble and 2j + 1 in its high one."""
    out, inputs = weight.shape
    packed = np.zeros((out, inputs // 2), np.uint8)
    scales = np.zeros((out, inputs // group), np.float32)
    values = np.zeros((out, inputs), np.float32)
    for o in range(out):
        for g in range(inputs // group):
            largest = max(abs(float(weight[o, c])) for c in range(g * group, (g + 1) * group))
            scales[o, g] = np.float32(largest) / np.float32(7) if largest > 0 else 1
        for c in range(inputs):
            scale = scales[o, c // group]
            q = min(7, max(-7, round(float(np.float32(weight[o, c]) / scale))))
            values[o, c] = np.float32(q) * scale
            packed[o, c // 2] |= (q + 8) << (4 * (c % 2))
    return packed, scales, values


@pytest.mark.parametrize("block", [quantize.BLOCK_ELEMENTS, 16, 40])
def test_int4_packs_and_dequantizes_as_the_element_by_element_reference(block, monkeypatch):
    """Whole, a row at a time and two rows at a time with a partial last block (quantize's
    blocks, which bound its temporaries on a large weight)."""
    monkeypatch.setattr(quantize, "BLOCK_ELEMENTS", block)
    g = np.random.default_rng(0)
    weight = g.standard_normal((5, 16)).astype(np.float32)
    weight[1, 8:] = 0  # an all-zero group: scale 1, every value 0
    weight[2, 3] = 10.0  # a group's largest value maps to 7 exactly
    w = QuantizedWeight("layer", "linear", (5, 16), "int4", 8)
    stored = w.quantize(weight)
    packed, scales, values = reference_int4(weight, 8)
    assert stored[w.values].dtype == np.uint8 and stored[w.scale].dtype == np.float32
    np.testing.assert_array_equal(stored[w.values], packed)
    np.testing.assert_array_equal(stored[w.scale], scales)
    assert scales[1, 1] == 1 and not values[1, 8:].any() and values[2, 3] == 10.0
    np.testing.assert_array_equal(w.dequantize(stored[w.values], stored[w.scale]), values)
    assert np.abs(values - weight).max() <= scales.max() / 2 + 1e-6  # within half a step
    # a Conv1D's [in, out] weight is stored as [out, in]
    conv1d = QuantizedWeight("layer", "conv1d", (16, 5), "int4", 8)
    stored = conv1d.quantize(weight.T.copy())
    np.testing.assert_array_equal(stored[conv1d.values], packed)
    np.testing.assert_array_equal(conv1d.dequantize(stored[conv1d.values], stored[conv1d.scale]), values.T)
    assert conv1d.stored_shapes == ((5, 8), (5, 2))
    assert conv1d.stored_specs == {n: (v.shape, v.dtype) for n, v in stored.items()}
    assert QuantizedWeight.from_json(conv1d.to_json()) == conv1d


@pytest.mark.parametrize("block", [quantize.BLOCK_ELEMENTS, 12, 30])
@pytest.mark.parametrize("kind, shape", [("linear", (5, 12)), ("conv1d", (12, 5)), ("conv", (5, 3, 2, 2))])
def test_int8_quantizes_each_output_channel_in_blocks_as_the_whole_weight(kind, shape, block, monkeypatch):
    """int8 per output channel (a Conv1D's columns), scale = max |W| / 127, q = round(W / scale),
    against that formula on the whole weight, quantized one, two and all channels at a time."""
    monkeypatch.setattr(quantize, "BLOCK_ELEMENTS", block)
    weight = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    w = QuantizedWeight("layer", kind, shape, "int8")
    stored = w.quantize(weight)
    axis = w.channel_axis
    others = tuple(d for d in range(weight.ndim) if d != axis)
    scale = (np.abs(weight).max(axis=others, keepdims=True) / np.float32(127)).astype(np.float32)
    np.testing.assert_array_equal(stored[w.values], np.clip(np.rint(weight / scale), -127, 127).astype(np.int8))
    np.testing.assert_array_equal(stored[w.scale], scale.reshape(-1))
    assert w.stored_specs == {n: (v.shape, v.dtype) for n, v in stored.items()}


class TinyLM(nn.Module):
    """An embedding tied to the head, one residual MLP block, two norms."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)
        self.final_norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(self.norm(h))))
        return self.head(self.final_norm(h)).flatten(0, 1)


def tiny_lm():
    torch.manual_seed(0)
    return TinyLM()


SCHEME = {
    "quantize": {"frozen": f"int4:group={GROUP}"},
    "down": "lora:r=4,alpha=8",
    "*norm": "full",
    "up.bias": "full",
}


def twin_of(model, program, start):
    """PyTorch's model of the program: the int4 weights dequantized by reference_int4 (the tied
    head shares the embedding's), LoRA on `down` as a hook adding (alpha / r) B(A(x)), with
    pock-mlir's starting adapter values."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for w in program.signature.quantized:
            weight = twin.get_submodule(w.module).weight
            weight.copy_(torch.from_numpy(reference_int4(weight.numpy(), GROUP)[2]))
    (adapter,) = program.signature.adapters
    down = twin.get_submodule(adapter.module)
    down.lora_A, down.lora_B = nn.Linear(HIDDEN, 4, bias=False), nn.Linear(4, WIDTH, bias=False)
    with torch.no_grad():
        down.lora_A.weight.copy_(torch.from_numpy(start[adapter.a]))
        down.lora_B.weight.copy_(torch.from_numpy(start[adapter.b]))
    down.register_forward_hook(lambda m, args, out: out + 2.0 * m.lora_B(m.lora_A(args[0])))
    return twin


@pytest.fixture(scope="module")
def lm():
    model = tiny_lm()
    x = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(2))
    program = pock.compile_training(model, x, y, optimizer=OPTIMIZER, sparse=SCHEME, functions="all")
    g = np.random.default_rng(0)  # B starts at zero, where A's gradient vanishes: give B values
    start = {
        **program.initial_params,
        **{a.b: (0.1 * g.standard_normal(a.b_shape)).astype(np.float32) for a in program.signature.adapters},
    }
    return SimpleNamespace(model=model, x=x, y=y, program=program, start=start, twin=twin_of(model, program, start))


def started(lm):
    trainer = lm.program.trainer()
    trainer.load_state_dict(lm.start, strict=False)
    return trainer


def test_int4_holds_the_linears_the_embedding_and_its_tied_head(lm):
    signature = lm.program.signature
    specs = {p.name: p for p in signature.params}
    assert [(w.module, w.kind, w.tied) for w in signature.quantized] == [
        ("embed", "embedding", ("head",)),
        ("up", "linear", ()),
        ("down", "linear", ()),
    ]
    for w, (out, inputs) in zip(signature.quantized, [(VOCAB, WIDTH), (HIDDEN, WIDTH), (WIDTH, HIDDEN)]):
        assert (specs[w.values].dtype, specs[w.values].shape) == ("uint8", (out, inputs // 2))
        assert (specs[w.scale].dtype, specs[w.scale].shape) == ("float32", (out, inputs // GROUP))
        assert w.weight not in specs
    assert "head.weight" not in specs
    assert sorted(signature.trainable) == sorted(
        [
            "down.lora_A.weight",
            "down.lora_B.weight",
            "up.bias",
            *(f"{n}.{p}" for n in ("norm", "final_norm") for p in ("weight", "bias")),
        ]
    )


def test_int4_gradients_match_pytorch_on_the_dequantized_weights(lm):
    trainable = lm.program.signature.trainable
    value, grads = started(lm).gradients(lm.x, lm.y)
    want_loss, want = torch_gradients(lm.twin, lm.x, lm.y, trainable=trainable)
    assert value == pytest.approx(want_loss, rel=1e-5)
    assert sorted(grads) == sorted(trainable)
    assert_gradients_close(grads, want, what="int4 gradient")


def test_int4_adamw_steps_match_torch_optim(lm):
    """Each loss within 1e-4 or 10x PyTorch float32's own distance from float64 (the suite's
    bound); the int4 values never change; the merged state_dict holds the dequantized weights
    under both keys of the tied one."""
    trainer = started(lm)
    trainable = lm.program.signature.trainable
    losses = [trainer.step(lm.x, lm.y) for _ in range(STEPS)]
    args = (lm.twin, lm.x, lm.y, OPTIMIZER, STEPS, "cross_entropy", trainable)
    want_losses, want = torch_trajectory(*args, float64=True)
    f32_losses, f32 = torch_trajectory(*args)
    for step, (got, w, f) in enumerate(zip(losses, want_losses, f32_losses), 1):
        assert abs(got - w) <= max(1e-4 * abs(w), 10 * abs(f - w)), f"loss at step {step}: {got} vs {w}"
    assert losses[-1] < losses[0]
    state = trainer.state_dict()
    strays = {n: 10 * np.linalg.norm(f32[n] - want[n]) for n in trainable}
    assert_gradients_close({n: state[n] for n in trainable}, {n: want[n] for n in trainable}, allowed=strays)
    for w in lm.program.signature.quantized:
        assert np.array_equal(state[w.values], lm.start[w.values])
    merged = trainer.merged_state_dict()
    dequantized_embedding = reference_int4(lm.model.embed.weight.detach().numpy(), GROUP)[2]
    np.testing.assert_array_equal(merged["embed.weight"], dequantized_embedding)
    np.testing.assert_array_equal(merged["head.weight"], dequantized_embedding)
    tuned = tiny_lm()  # the export loads strictly and computes what the program computes
    tuned.load_state_dict({n: torch.from_numpy(v) for n, v in merged.items()})
    with torch.no_grad():
        np.testing.assert_allclose(trainer.evaluate(lm.x.numpy()), tuned(lm.x).numpy(), rtol=1e-5, atol=1e-6)


def test_int4_unpacks_its_weights_chunk_by_chunk(lm):
    """No dispatch of the program writes a float32 tensor of a quantized weight's size, nor the
    products of a contraction (tokens x weight): the forward and the input gradient unpack each
    weight in chunks of at most half of it (pock-expand-custom), different for the two, so
    IREE cannot merge them into one float32 weight (the embedding's lookup unpacks the rows it
    gathers only)."""
    from iree.compiler import compile_str

    from pock_mlir.iree_flags import TO_STREAM

    program = lm.program
    stream = compile_str(program.ir("lowered"), extra_args=[*program.iree_flags(), TO_STREAM]).decode()
    written = [
        int(np.prod([int(d) for d in shape.split("x")]))
        for shape in re.findall(r"writeonly:tensor<([\dx]+)xf32>", stream)
    ]
    weights = {int(np.prod(w.weight_shape)) for w in program.signature.quantized}
    assert written and weights == {VOCAB * WIDTH, HIDDEN * WIDTH}
    assert not weights & set(written), sorted(set(written))
    assert max(written) < lm.x.numel() * min(weights), sorted(set(written))


def test_int4_weights_would_cost_data_tiling_several_times_their_bytes(lm):
    """Data tiling would re-lay every unpacked float32 weight a matmul reads, the forward's and the
    input gradient's, in every step: at least the forward's reads of the up, down and tied head
    weights, against the int4 bytes and scales they are stored in (and the adapters'), more than
    MAX_WEIGHT_COPIES, so the switch never data-tiles an int4 program (the rule's cases:
    lit_tests/passes/pock-backend-switch.mlir)."""
    with make_context():
        module = ir.Module.parse(lm.program.ir("sparse"))
        run_pipeline(module, "pock-expand-custom")
        copies = module_weight_copies(module.operation)
    specs = {p.name: p for p in lm.program.signature.params}
    (adapter,) = lm.program.signature.adapters
    stored = sum(
        int(np.prod(specs[name].shape)) * np.dtype(specs[name].dtype).itemsize
        for name in (*(n for w in lm.program.signature.quantized for n in (w.values, w.scale)), adapter.a, adapter.b)
    )
    assert copies.stored == stored
    assert copies.copied >= 4 * (2 * HIDDEN * WIDTH + VOCAB * WIDTH)
    assert copies.ratio > MAX_WEIGHT_COPIES
    assert lm.program.backend.data_tiling.form == "plain"


def test_an_int4_bundle_stores_the_packed_bytes_and_trains_as_the_program(lm, tmp_path):
    """The bundle holds the uint8 bytes and scales: the float32 model's bytes less what each weight
    saves (half a byte a value, 4 bytes a group); its Trainer steps as the program's."""
    from pock_mlir.bundle import write_bundle
    from pock_mlir.runtime import Trainer
    from pock_mlir.runtime.bundle import load_bundle

    write_bundle(lm.program, tmp_path / "bundle", example_inputs=lm.x, example_target=lm.y, loss="cross_entropy")
    bundle = load_bundle(tmp_path / "bundle")
    quantized = bundle.signature.quantized
    assert quantized == lm.program.signature.quantized
    assert all(bundle.initial_params[w.values].dtype == np.uint8 for w in quantized)
    adapters = sum(v.nbytes for n, v in bundle.initial_params.items() if ".lora_" in n)
    float_bytes = sum(p.numel() * 4 for p in lm.model.parameters())
    saved = sum(
        4 * np.prod(w.weight_shape) - np.prod(w.weight_shape) // 2 - 4 * np.prod(w.weight_shape) // GROUP
        for w in quantized
    )
    assert sum(v.nbytes for v in bundle.initial_params.values()) - adapters == float_bytes - saved
    ours, theirs = started(lm), Trainer.from_bundle(tmp_path / "bundle")
    theirs.load_state_dict(lm.start, strict=False)
    assert [theirs.step(lm.x, lm.y) for _ in range(2)] == [ours.step(lm.x, lm.y) for _ in range(2)]


def resolve(model, sparse):
    return resolve_sparse(sparse, model, {n: tuple(p.shape) for n, p in model.named_parameters()})


@pytest.mark.parametrize(
    "frozen, message",
    [
        ("int2", r"quantize takes \{frozen: int8\}, \{frozen: int4\} or \{frozen: 'int4:group=N'\}.*got 'int2'"),
        ("int4:group=x", r"got 'int4:group=x'"),
        ("int8:group=32", r"got 'int8:group=32'"),
        ("int4:group=7", r"int4's group must be even \(two values a byte\), got group=7"),
        ("int4:group=0", r"\(N even, >= 2\), got 'int4:group=0'"),
    ],
)
def test_bad_int4_formats_are_one_clear_error(frozen, message):
    with pytest.raises(SparseConfigError, match=message):
        resolve(tiny_lm(), {"quantize": {"frozen": frozen}})


def test_an_int4_group_must_divide_each_quantized_layers_inputs():
    model = tiny_lm()
    policies = resolve(model, {"quantize": {"frozen": "int4:group=48"}, "*norm": "full"}).policies
    with pytest.raises(QuantizeError, match=r"int4:group=48 needs .* multiple of 48, but embed has 32; choose a group"):
        frozen_weights(model, policies, "int4:group=48")
    # int8 keeps the tied weight float32 and stores no embedding
    assert [w.module for w in frozen_weights(model, policies, "int8")] == ["up", "down"]
