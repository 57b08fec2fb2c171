"""The model zoo's builders: library models as users have them (torchvision, timm, Hugging Face
transformers, torch.nn recurrent layers), random-init tiny configs (nothing is downloaded). The
zoo's tests (tests/test_zoo.py) check pock-mlir's gradients on them; the held-out bench
(bench/held_out.py) times them at other batches."""

from __future__ import annotations

import importlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.models import ADAMW, MOMENTUM_SGD, BenchModel, KeywordSpotter, _spectrograms, _token_loss
from bench.models import MODELS as BENCH_MODELS

VOCAB, SEQ, CLASSES = 97, 16, 10

# torchvision, timm and transformers are imported by the builders that need them: importing all
# three took 1.9 s, which every bench child paid, whatever model it ran.


def next_token_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def classification_loss(out, y):
    return F.cross_entropy(out.logits if hasattr(out, "logits") else out, y)


def mobilenet_v2():
    import torchvision

    return torchvision.models.MobileNetV2(
        num_classes=CLASSES,
        width_mult=0.5,
        dropout=0.0,
        inverted_residual_setting=[[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2]],
    )


def mobilenet_v3():
    import torchvision
    from torchvision.models.mobilenetv3 import InvertedResidualConfig

    blocks = [
        InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
        InvertedResidualConfig(16, 3, 72, 24, False, "RE", 2, 1, 1.0),
        InvertedResidualConfig(24, 5, 96, 40, True, "HS", 2, 1, 1.0),
        InvertedResidualConfig(40, 5, 120, 40, True, "HS", 1, 1, 1.0),
    ]
    return torchvision.models.MobileNetV3(blocks, last_channel=128, num_classes=CLASSES, dropout=0.0)


def shufflenet_v2():
    import torchvision

    return torchvision.models.ShuffleNetV2([2, 1, 1], [8, 16, 32, 64, 128], num_classes=CLASSES)


def resnet():
    import torchvision
    from torchvision.models.resnet import BasicBlock

    return torchvision.models.ResNet(BasicBlock, [1, 1, 1, 1], num_classes=CLASSES)


def efficientnet():  # EfficientNet-B0's blocks, fewer and narrower; B0's dropout and stochastic depth
    import torchvision
    from torchvision.models.efficientnet import MBConvConfig

    blocks = [MBConvConfig(1, 3, 1, 16, 8, 1), MBConvConfig(6, 3, 2, 8, 16, 2), MBConvConfig(6, 5, 2, 16, 24, 2)]
    return torchvision.models.EfficientNet(
        blocks, dropout=0.2, stochastic_depth_prob=0.2, num_classes=CLASSES, last_channel=64
    )


def vit():
    import timm

    return timm.models.VisionTransformer(
        img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4, num_classes=CLASSES
    )


def convnext():
    import timm

    return timm.models.ConvNeXt(depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), num_classes=CLASSES)


def _hf_model(model_class, config_class, **config):
    """A random-init Hugging Face `model_class` of the zoo's vocabulary and context length."""
    return model_class(config_class(vocab_size=VOCAB, max_position_embeddings=32, **config))


# One layer has every op the text models' deeper stacks repeat (each more costs compile time); the
# presets' tests, which tell the last layer from the others, take two.
def llama(layers=1):
    import transformers

    return _hf_model(
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )


def gpt2():
    import transformers

    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
        )
    )


def bert(layers=1):
    import transformers

    config = dict(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=128, num_labels=3)
    return _hf_model(transformers.BertForSequenceClassification, transformers.BertConfig, **config)


def distilbert(layers=1):
    import transformers

    config = dict(dim=64, n_layers=layers, n_heads=4, hidden_dim=128, num_labels=3)
    return _hf_model(transformers.DistilBertForSequenceClassification, transformers.DistilBertConfig, **config)


FRAMES, FEATURES = 4, 40  # MFCC frames of a keyword: each is a step of the unrolled recurrence


class GRUSpotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(FEATURES, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, frames):
        outputs, _ = self.rnn(frames)
        return self.head(outputs[:, -1])


class BiLSTMSpotter(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(FEATURES, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, CLASSES)

    def forward(self, frames):
        _, (final, _) = self.rnn(frames)
        return self.head(torch.cat([final[-2], final[-1]], -1))


VISION = {
    "tv-mobilenet-v2": mobilenet_v2,
    "tv-mobilenet-v3": mobilenet_v3,
    "tv-shufflenet-v2": shufflenet_v2,
    "tv-resnet": resnet,
    "tv-efficientnet": efficientnet,
    "timm-vit": vit,
    "timm-convnext": convnext,
}
TEXT = {
    "hf-llama": (llama, next_token_loss),
    "hf-gpt2": (gpt2, next_token_loss),
    "hf-bert-classifier": (bert, classification_loss),
    "hf-distilbert-classifier": (distilbert, classification_loss),
}
RECURRENT = {"torch-gru-spotter": GRUSpotter, "torch-bilstm-spotter": BiLSTMSpotter}
MODELS = {**{name: (make, classification_loss) for name, make in {**VISION, **RECURRENT}.items()}, **TEXT}


def _images(batch: int, size: int = 64, seed: int = 1):
    def make():
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 3, size, size, generator=g),), torch.randint(0, CLASSES, (batch,), generator=g)

    return make


def _frames(batch: int, frames: int = FRAMES, features: int = FEATURES):
    def make():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(batch, frames, features, generator=g),), torch.randint(0, CLASSES, (batch,), generator=g)

    return make


def _text(batch: int, classes: int | None = None, vocab: int = VOCAB, seq: int = SEQ):
    """Token ids and, with `classes`, a label per sequence, else the next tokens."""

    def make():
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (batch, seq), generator=g)
        shape = (batch,) if classes else (batch, seq)
        return (ids,), torch.randint(0, classes or vocab, shape, generator=g)

    return make


def _eval(make):
    """A text model in eval mode (its dropout off), as the zoo's tests train it."""
    return lambda: make().eval()


def _llama_like():
    t = importlib.import_module("examples.models.transformer")
    return t.LlamaLike(t.LlamaConfig(vocab=256, max_len=32, dim=96, heads=4, kv_heads=2, layers=3, hidden=192))


def _edge_mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _edge_mlp_batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, 64, generator=g),), torch.randint(0, 10, (1,), generator=g)


def _held_out(name, title, make, batch, loss, sparse, optimizer=MOMENTUM_SGD, **kw) -> BenchModel:
    def build():
        torch.manual_seed(0)
        return make()

    return BenchModel(name, title, build, batch, loss, optimizer, sparse, **kw)


# The held-out part of the held-out bench (bench/held_out.py): models of the bench's kinds at
# batches 1-8 that no tuning table, flag set or heuristic was fitted on (bench/iree_study.py and
# pock_mlir/tuning/*.json see the bench's MODELS only; tests/test_bench.py checks the names).
HELD_OUT = {
    m.name: m
    for m in (
        _held_out(
            "ho-tv-resnet",
            "torchvision ResNet [1,1,1,1], 64 px, batch 4",
            resnet,
            _images(4),
            classification_loss,
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-tv-mobilenet-v3",
            "torchvision MobileNetV3 (squeeze-excite), 64 px, batch 4",
            mobilenet_v3,
            _images(4),
            classification_loss,
            {"preset": "mobilenet-last-2"},
        ),
        _held_out(
            "ho-tv-mobilenet-v2",
            "torchvision MobileNetV2 x0.5, 3 stages, 64 px, batch 1",
            mobilenet_v2,
            _images(1),
            classification_loss,
            {"preset": "mobilenet-last-2"},
        ),
        _held_out(
            "ho-tv-shufflenet-v2",
            "torchvision ShuffleNetV2, 64 px, batch 8",
            shufflenet_v2,
            _images(8),
            classification_loss,
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-tv-efficientnet",
            "torchvision EfficientNet (3 MBConv stages), 64 px, batch 2",
            efficientnet,
            _images(2),
            classification_loss,
            {"preset": "mobilenet-last-2"},
        ),
        _held_out(
            "ho-timm-vit",
            "timm ViT, 2 layers, d=64, 64 px, batch 2",
            vit,
            _images(2),
            classification_loss,
            {"preset": "transformer-last-1"},
            ADAMW,
        ),
        _held_out(
            "ho-timm-convnext",
            "timm ConvNeXt (1,1,1,1), 64 px, batch 2",
            convnext,
            _images(2),
            classification_loss,
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-hf-llama",
            f"Hugging Face LLaMA, 2 layers, d=64, seq {SEQ}, batch 2",
            _eval(lambda: llama(2)),
            _text(2),
            next_token_loss,
            {"preset": "transformer-last-1"},
            ADAMW,
            tokens_per_step=2 * SEQ,
        ),
        _held_out(
            "ho-hf-gpt2",
            f"Hugging Face GPT-2, 2 layers, d=64, seq {SEQ}, batch 2",
            _eval(gpt2),
            _text(2),
            next_token_loss,
            {"preset": "transformer-last-1"},
            ADAMW,
            tokens_per_step=2 * SEQ,
        ),
        _held_out(
            "ho-hf-bert",
            f"Hugging Face BERT classifier, 2 layers, d=64, seq {SEQ}, batch 4",
            _eval(lambda: bert(2)),
            _text(4, classes=3),
            classification_loss,
            {"preset": "transformer-last-1"},
            ADAMW,
        ),
        _held_out(
            "ho-hf-distilbert",
            f"Hugging Face DistilBERT classifier, 2 layers, d=64, seq {SEQ}, batch 4",
            _eval(lambda: distilbert(2)),
            _text(4, classes=3),
            classification_loss,
            {"preset": "transformer-last-1"},
            ADAMW,
        ),
        _held_out(
            "ho-gru-spotter",
            f"GRU keyword spotter, 2 layers, {FRAMES} frames, batch 4",
            GRUSpotter,
            _frames(4),
            classification_loss,
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-bilstm-spotter",
            f"BiLSTM keyword spotter, {FRAMES} frames, batch 4",
            BiLSTMSpotter,
            _frames(4),
            classification_loss,
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-kws-narrow",
            "Conv1d keyword spotter, width 32, 40x98 MFCC, batch 2",
            lambda: KeywordSpotter(width=32),
            _spectrograms(2, 40, 98, 12),
            "cross_entropy",
            {"preset": "last-2"},
        ),
        _held_out(
            "ho-llama-like",
            "LLaMA-like, 3 layers, d=96, seq 32, batch 2",
            _llama_like,
            _text(2, vocab=256, seq=32),
            _token_loss,
            {"preset": "transformer-last-1", "tokens": "frozen"},
            ADAMW,
            tokens_per_step=64,
            jax_port=True,
        ),
        _held_out(
            "ho-edge-mlp",
            "MLP 64-128-10, batch 1",
            _edge_mlp,
            _edge_mlp_batch,
            "cross_entropy",
            {"preset": "bias-only"},
        ),
    )
}


def bench_model(name: str) -> BenchModel:
    """A bench model or a held-out one, by name (the bench's children train either)."""
    return BENCH_MODELS[name] if name in BENCH_MODELS else HELD_OUT[name]
