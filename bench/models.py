"""The benchmark models: what to build, the batch it trains on, its loss, optimizer and sparse scheme.

CNNs and transformers come from examples/models/; a model whose module is missing, or whose
compilation lacks a derivative rule, shows as "not supported yet" in the results instead of
stopping the run.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import yaml

import pock_mlir as pock


@dataclass(frozen=True)
class BenchModel:
    name: str
    title: str
    build: Callable[[], nn.Module]
    batch: Callable[[], tuple[tuple[torch.Tensor, ...], torch.Tensor]]
    loss: object  # a pock loss name or a callable
    optimizer: object
    sparse: dict  # the "sparse" scheme: a pock_mlir.sparse preset, refined by patterns
    lora: dict | None = None  # the "lora" scheme's patterns: LoRA on the attention projections
    lora_all: dict | None = None  # the "lora-all" scheme's: LoRA on every linear of the blocks
    tokens_per_step: int | None = None  # for language models: report tokens/s
    compile_target_s: float | None = None  # the full-BP compile time this model should stay within
    jax_port: bool = False  # a LlamaLike, which bench/jax_child.py ports to JAX: JAX trains it too
    searched: Callable[[], tuple[dict, str]] | None = None  # the "searched" scheme and its label (quality_searched)


def _examples(module: str):
    """examples/models/<module>.py, imported from the repository root."""
    return importlib.import_module(f"examples.models.{module}")


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn()

    return build


def _images(batch: int, size: int, classes: int):
    def make():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(batch, 3, size, size, generator=g),), torch.randint(0, classes, (batch,), generator=g)

    return make


def _tokens(batch: int, seq: int, vocab: int, target_shape):
    def make():
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1, vocab, (batch, seq), generator=g)
        return (ids,), torch.randint(
            0,
            vocab if target_shape == "tokens" else 2,
            (batch, seq) if target_shape == "tokens" else (batch,),
            generator=g,
        )

    return make


def _mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def _mlp_batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(64, 256, generator=g),), torch.randint(0, 10, (64,), generator=g)


def _mobilenet():
    return _examples("cnn").MobileNetV2Like(width=0.5, num_classes=10)


def _resnet():
    return _examples("cnn").ResNetLike(num_classes=10)


BERT_SEQ, BERT_BATCH, BERT_VOCAB, BERT_LAYERS = 128, 8, 8000, 4
LLAMA_SEQ, LLAMA_BATCH, LLAMA_VOCAB, LLAMA_LAYERS = 256, 4, 8000, 6


def _bert():
    t = _examples("transformer")
    return t.BertLike(
        t.BertConfig(vocab=BERT_VOCAB, max_len=BERT_SEQ, dim=256, heads=4, layers=BERT_LAYERS, hidden=1024, classes=2)
    )


def _llama():
    t = _examples("transformer")
    return t.LlamaLike(
        t.LlamaConfig(
            vocab=LLAMA_VOCAB, max_len=LLAMA_SEQ, dim=384, heads=6, kv_heads=2, layers=LLAMA_LAYERS, hidden=1024
        )
    )


QUALITY_RESULTS = Path(__file__).resolve().parent.parent / "examples" / "quality" / "results"
SEARCHED_AT = "sparse preset (last 2 blocks)"  # the quality tasks' hand-written scheme whose memory it was searched at


@dataclass(frozen=True)
class QualitySearch:
    """Where a bench model's "searched" scheme comes from: the scheme pock.search_sparse found on a
    quality task (examples/quality/TASK.py --search presets) at the memory of its SEARCHED_AT
    scheme, where its quality against PyTorch full BP is measured (#21)."""

    task: str  # examples/quality/TASK.py, which writes results/TASK.json
    metric: str  # the task's test metric: "test_loss" or "test_accuracy"
    prefix: str = ""  # the task's pock-mlir rows are named PREFIX + scheme


LANGUAGE_SEARCH = QualitySearch("language", "test_loss", prefix="pock ")
TEXT_SEARCH = QualitySearch("text", "test_accuracy")


def quality_searched(search: QualitySearch, layers: int) -> tuple[dict, str]:
    """The scheme of `search` for a model of `layers` blocks, and its label: what it trains and its
    test metric against PyTorch full BP's on the task. The task's model may have fewer blocks: its
    block i is block i + (layers - its blocks) here, counted from the last as the transformer
    presets count, and the blocks below stay frozen."""
    from examples.quality.cli import REFERENCE, searched_schemes

    try:
        task = json.loads((QUALITY_RESULTS / f"{search.task}.json").read_text())
        rows = task["results"]
        at_memory = {rows[search.prefix + SEARCHED_AT]["device_mb"]: SEARCHED_AT}
        (searched,) = searched_schemes(QUALITY_RESULTS, search.task, at_memory)
        entries = yaml.safe_load(Path(searched.file).read_text())
        value, reference = rows[search.prefix + searched.name][search.metric], rows[REFERENCE][search.metric]
    except (OSError, KeyError, ValueError) as e:
        raise RuntimeError(
            f"the searched scheme is the {search.task} task's (missing: {e}); run "
            f"python examples/quality/{search.task}.py --search presets"
        ) from None
    shift = layers - task["config"]["layers"]
    scheme = {
        re.sub(r"^blocks\.(\d+)\.", lambda m: f"blocks.{int(m.group(1)) + shift}.", name): policy
        for name, policy in entries.items()
    }
    trained = sum(policy != "frozen" for name, policy in entries.items() if name != "default")
    quality = (
        f"test loss {value / reference - 1:+.1%}"
        if search.metric == "test_loss"
        else f"test accuracy {100 * (value - reference):+.1f} points"
    )
    moved = f", blocks moved up {shift}" if shift else ""
    return scheme, (
        f"the {search.task} task's search at its sparse preset's memory{moved}: {trained} tensors; "
        f"{quality} vs PyTorch full BP there"
    )


def _token_loss(logits, target):
    return _examples("transformer").token_cross_entropy(logits, target)


HF_LLAMA_SEQ, HF_LLAMA_BATCH, HF_LLAMA_VOCAB = 128, 4, 8000


def _torchvision_mobilenet():
    return importlib.import_module("torchvision").models.mobilenet_v2(num_classes=10)


def _hf_llama():
    transformers = importlib.import_module("transformers")
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=HF_LLAMA_VOCAB,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=HF_LLAMA_SEQ,
            tie_word_embeddings=True,
        )
    )


class KeywordSpotter(nn.Module):
    """A Conv1d keyword spotter of the kind edge devices train: 40 MFCCs x 98 frames (one second),
    four conv-BN-ReLU layers, global average pooling, 12 keywords."""

    def __init__(self, mfcc: int = 40, width: int = 64, keywords: int = 12):
        super().__init__()
        layers, channels = [], mfcc
        for stride in (1, 2, 2, 2):
            layers += [
                nn.Conv1d(channels, width, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm1d(width),
                nn.ReLU(),
            ]
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, keywords)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=2))


def _spectrograms(batch: int, mfcc: int, frames: int, keywords: int):
    def make():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(batch, mfcc, frames, generator=g),), torch.randint(0, keywords, (batch,), generator=g)

    return make


def _tiny_vit():
    return importlib.import_module("timm").models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=96, depth=4, num_heads=3, num_classes=10
    )


TINY_LLAMA_SEQ, TINY_LLAMA_BATCH, TINY_LLAMA_VOCAB = 64, 4, 512


def _tiny_llama():
    t = _examples("transformer")
    return t.LlamaLike(
        t.LlamaConfig(
            vocab=TINY_LLAMA_VOCAB, max_len=TINY_LLAMA_SEQ, dim=128, heads=4, kv_heads=2, layers=2, hidden=256
        )
    )


def _next_token_loss(output, target):
    """As a user writes it for a Hugging Face model: on the ModelOutput's logits."""
    return torch.nn.functional.cross_entropy(output.logits.flatten(0, 1), target.flatten())


MOMENTUM_SGD = pock.SGD(lr=0.01, momentum=0.9)
ADAMW = pock.AdamW(lr=1e-4, weight_decay=0.01)

LORA = "lora:r=8,alpha=16"  # PockEngine's LoRA baseline: r = 8 on the attention projections
# Sparse schemes: PockEngine's presets, with the blocks before the updated ones frozen entirely
# (the presets also train every bias and norm, which keeps the backward running through the
# whole network; freezing them lets it stop at the first updated block).
MODELS = {
    m.name: m
    for m in (
        BenchModel(
            "mlp",
            "MLP 256-512-512-10, batch 64",
            _seeded(_mlp),
            _mlp_batch,
            "cross_entropy",
            MOMENTUM_SGD,
            {"preset": "bias-only"},
        ),
        BenchModel(
            "mobilenetv2",
            "MobileNetV2 x0.5, 96 px, batch 8",
            _seeded(_mobilenet),
            _images(8, 96, 10),
            "cross_entropy",
            MOMENTUM_SGD,
            {"preset": "mobilenet-last-4", "features.[0-9]": "frozen", "features.1[0-3]": "frozen"},
        ),
        BenchModel(
            "resnet18",
            "ResNet-18-like, 64 px, batch 8",
            _seeded(_resnet),
            _images(8, 64, 10),
            "cross_entropy",
            MOMENTUM_SGD,
            {"preset": "last-4"},
        ),
        BenchModel(
            "bert",
            f"BERT-like, {BERT_LAYERS} layers, d=256, seq {BERT_SEQ}, batch {BERT_BATCH}",
            _seeded(_bert),
            _tokens(BERT_BATCH, BERT_SEQ, BERT_VOCAB, "class"),
            "cross_entropy",
            ADAMW,
            {
                "preset": "transformer-last-2",
                "tokens": "frozen",
                "positions": "frozen",
                "norm": "frozen",
                "blocks.0": "frozen",
                "blocks.1": "frozen",
            },
            lora={"blocks.*.attention": LORA, "classifier": "full"},
            lora_all={"blocks": LORA, "classifier": "full"},
            searched=functools.partial(quality_searched, TEXT_SEARCH, BERT_LAYERS),
        ),
        BenchModel(
            "llama",
            f"LLaMA-like, {LLAMA_LAYERS} layers, d=384, seq {LLAMA_SEQ}, batch {LLAMA_BATCH}",
            _seeded(_llama),
            _tokens(LLAMA_BATCH, LLAMA_SEQ, LLAMA_VOCAB, "tokens"),
            _token_loss,
            ADAMW,
            {"preset": "transformer-last-2", "tokens": "frozen", "blocks.[0-3]": "frozen"},
            lora={"blocks.*.attention": LORA},
            lora_all={"blocks": LORA},
            tokens_per_step=LLAMA_BATCH * LLAMA_SEQ,
            jax_port=True,
            searched=functools.partial(quality_searched, LANGUAGE_SEARCH, LLAMA_LAYERS),
        ),
        # Library models as users have them (random init): compile time is what these rows are for.
        BenchModel(
            "tv-mobilenetv2",
            "torchvision MobileNetV2, 96 px, batch 8",
            _seeded(_torchvision_mobilenet),
            _images(8, 96, 10),
            "cross_entropy",
            MOMENTUM_SGD,
            {"preset": "mobilenet-last-4", "features.[0-9]": "frozen", "features.1[0-3]": "frozen"},
            compile_target_s=30,
        ),
        BenchModel(
            "hf-llama",
            f"Hugging Face LLaMA, 2 layers, d=256, seq {HF_LLAMA_SEQ}, batch {HF_LLAMA_BATCH}",
            _seeded(_hf_llama),
            _tokens(HF_LLAMA_BATCH, HF_LLAMA_SEQ, HF_LLAMA_VOCAB, "tokens"),
            _next_token_loss,
            ADAMW,
            {"preset": "transformer-last-1", "model.embed_tokens": "frozen", "model.layers.0": "frozen"},
            lora={"model.layers.*.self_attn": LORA},
            lora_all={"model.layers": LORA},
            tokens_per_step=HF_LLAMA_BATCH * HF_LLAMA_SEQ,
            compile_target_s=10,
        ),
        # Small edge models at small batches, where a step's fixed cost (calls, dispatches) shows.
        BenchModel(
            "kws",
            "Conv1d keyword spotter, 40x98 MFCC, batch 8",
            _seeded(KeywordSpotter),
            _spectrograms(8, 40, 98, 12),
            "cross_entropy",
            MOMENTUM_SGD,
            {"preset": "last-2"},
        ),
        BenchModel(
            "tiny-vit",
            "timm ViT, 4 layers, d=96, 32 px, batch 4",
            _seeded(_tiny_vit),
            _images(4, 32, 10),
            "cross_entropy",
            ADAMW,
            {"preset": "transformer-last-1"},
        ),
        BenchModel(
            "tiny-llama",
            f"LLaMA-like, 2 layers, d=128, seq {TINY_LLAMA_SEQ}, batch {TINY_LLAMA_BATCH}",
            _seeded(_tiny_llama),
            _tokens(TINY_LLAMA_BATCH, TINY_LLAMA_SEQ, TINY_LLAMA_VOCAB, "tokens"),
            _token_loss,
            ADAMW,
            {"preset": "transformer-last-1", "tokens": "frozen", "blocks.0": "frozen"},
            lora={"blocks.*.attention": LORA},
            lora_all={"blocks": LORA},
            tokens_per_step=TINY_LLAMA_BATCH * TINY_LLAMA_SEQ,
            jax_port=True,
        ),
    )
}
QUICK_MODELS = ("mlp",)
# PockEngine's comparison (its Table 4): sparse BP against LoRA, each also over an int8 frozen base
# ("-int8"), on the models that have LoRA schemes (the transformers).
# "searched": a scheme pock.search_sparse found on a quality task, where its quality is measured.
SCHEMES = ("full", "sparse", "sparse-int8", "lora", "lora-int8", "lora-all", "lora-all-int8", "searched")
PEFT_SCHEMES = ("lora", "lora-all")  # the schemes PyTorch runs too, through PEFT (it has no int8 base on the CPU)
INT8 = {"quantize": {"frozen": "int8"}}


def ort_optimizer(optimizer):
    """The optimizer ONNX Runtime's on-device training runs for `optimizer`: it has AdamW and SGD
    without momentum, so momentum SGD runs there as plain SGD."""
    if isinstance(optimizer, pock.SGD) and optimizer.momentum:
        return replace(optimizer, momentum=0.0)
    return optimizer


# The bench losses ONNX Runtime's LossType states on the model's output, for the rows that train the
# model's .onnx file (bench/child.py's "onnx-file"): cross entropy on (N, C) logits and (N,) labels.
ORT_LOSS_TYPES = {"cross_entropy": "CrossEntropyLoss"}


def runs_scheme(model: BenchModel, scheme: str) -> bool:
    """Whether the model has the scheme, without reading the files a searched scheme comes from (its
    row's child does: missing files fail that row alone)."""
    return model.searched is not None if scheme == "searched" else scheme_spec(model, scheme) is not None


def scheme_spec(model: BenchModel, scheme: str) -> tuple[dict | str, str] | None:
    """What compile_training gets as `sparse=` for a scheme, and how the results name it; None for
    a scheme this model does not run."""
    if scheme == "full":
        return "full", "full"
    if scheme == "searched":
        return model.searched() if model.searched else None
    base, int8 = scheme.removesuffix("-int8"), scheme.endswith("-int8")
    spec = {"sparse": model.sparse, "lora": model.lora, "lora-all": model.lora_all}[base]
    if not spec or (int8 and not model.lora):
        return None
    if int8:
        spec = {**spec, **INT8}
    return dict(spec), ", ".join(f"{k}={v}" if k != "preset" else v for k, v in spec.items())


def trainable_names(spec, module: nn.Module) -> set[str]:
    """Parameters the scheme updates at all (PyTorch cannot update a channel slice: those train fully)."""
    from pock_mlir.sparse import resolve_sparse

    names = {n: tuple(p.shape) for n, p in module.named_parameters()}
    if spec == "full":
        return set(names)
    scheme = resolve_sparse(spec, module, names)
    return {n for n, policy in scheme.policies.items() if policy.kind != "frozen"}
