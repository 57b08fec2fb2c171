"""Sparse-update schemes: which parameters (and which of their output channels) to train.

`compile_training(..., sparse=...)` takes None (train everything), a dict, a `SparseUpdate`,
a preset name or the path of a YAML/JSON file holding the dict. The dict maps glob patterns
to policies; a pattern names parameters (`features.3.conv.0.weight`) or modules
(`features.3`, which covers every parameter inside it):

    preset: mobilenet-last-2        # optional: start from a preset, the patterns refine it
    default: frozen                 # parameters no pattern names (frozen unless said otherwise)
    quantize: {frozen: int8}        # optional: frozen layer weights stored as int8, or int4 (pock_mlir/quantize.py)
    "*.bias": full                  # quote patterns that start with * in YAML (an alias otherwise)
    features.16.conv.0: 0.25        # a ratio r in (0, 1]: the first ceil(r * C) output channels
    classifier: full

Policies: `full`, `frozen`, `bias` (the matched modules update their biases only), a
ratio, or LoRA: `{lora: {r: 8, alpha: 16}}` or `lora:r=8,alpha=16` gives every nn.Linear,
Hugging Face Conv1D and ungrouped nn.Conv2d the pattern names (or that a named module
contains) a LoRA adapter; their own parameters freeze and the adapters train
(pock_mlir/lora.py). Patterns apply in order, so a later, more specific pattern overrides an
earlier, broader one. A wildcard pattern that matches nothing is listed as a warning in
`program.report()` (one scheme file can serve a model family); an exact name that matches
nothing, a ratio outside (0, 1], `bias` on modules without a bias and a ratio on a scalar are
SparseConfigErrors naming the closest names.

Presets (following PockEngine's schemes), by name or `SparseUpdate.preset(family, k=...)`:

    full                  every parameter
    bias-only             every bias
    last-K                the last K layers: every parameter-holding module from the K-th last
                          layer that is not a normalization on (norms go with the layer before);
                          each level of a stacked nn.GRU/LSTM/RNN is a layer of its own
    mobilenet-last-K      every bias, plus the first pointwise layer of each of the last K blocks
                          (torchvision MobileNetV2/V3, EfficientNet, ShuffleNetV2, ConvNeXt)
    transformer-last-K    every bias and normalization parameter, plus the attention
                          projections and the first FFN linear of each of the last K blocks
                          (Hugging Face decoders and encoders, timm ViTs, nn.MultiheadAttention)

Structure comes from module types and names, in definition order. A block is an element of
an nn.Sequential or nn.ModuleList that contains exactly one depthwise conv (groups ==
in_channels > 1; MobileNet's inverted residuals) or one attention module (a type whose name
contains "Attention", e.g. nn.MultiheadAttention), not nested in another such block. A
block's first pointwise layer is its first 1x1 ungrouped conv or linear (ConvNeXt's, over
channels) outside a squeeze-excite module (a type whose name contains "Squeeze", "Excit" or
ends in "SEModule"). A block's first FFN linear is its first nn.Linear (or Hugging Face's
Conv1D, GPT-2's linear) outside the attention module. A normalization is a module whose type
name contains "Norm". Presets other than `full` and
`bias-only` need the PyTorch model, so `pock-sparse-bp{config=FILE}` on bare IR takes only
patterns and those two.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import re
from dataclasses import dataclass, field

import torch.nn as nn

from pock_mlir.abi import Policy
from pock_mlir.layers import adapter_kind
from pock_mlir.lora import Adapter, LoraError, LoraPolicy
from pock_mlir.quantize import QuantizeError, parse_format


class SparseConfigError(ValueError):
    pass


_PRESET = re.compile(r"^(?:(full|bias-only)|(?:(mobilenet|transformer)-)?last-(\d+))$")


@dataclass
class SparseUpdate:
    """Patterns -> policies, applied in order over `default`, optionally refining a preset."""

    rules: list[tuple[str, object]] = field(default_factory=list)
    default: object = "frozen"
    base_preset: str | None = None  # e.g. "mobilenet-last-4"; resolved against the model
    quantize: str | None = None  # "int8", "int4", "int4:group=64": frozen layer weights stored so (quantize.py)

    @staticmethod
    def preset(family: str, k: int | None = None) -> SparseUpdate:
        """SparseUpdate.preset("mobilenet", k=4) is the preset "mobilenet-last-4"."""
        if family in ("last", "mobilenet", "transformer") and k is None:
            raise SparseConfigError(f"preset '{family}' needs k, how many of the last blocks to update")
        name = family if k is None else f"last-{k}" if family == "last" else f"{family}-last-{k}"
        _parse_preset(name)
        return SparseUpdate(base_preset=name)

    @staticmethod
    def from_mapping(mapping: dict, where: str = "sparse") -> SparseUpdate:
        mapping = dict(mapping)
        default = mapping.pop("default", "frozen")
        preset = mapping.pop("preset", None)
        if preset is not None:
            _parse_preset(preset, where)
        quantize = _parse_quantize(mapping.pop("quantize", None), where)
        bad = [key for key in mapping if not isinstance(key, str)]
        if bad:
            raise SparseConfigError(f"{where}: patterns must be strings, got {bad[0]!r}")
        return SparseUpdate(rules=list(mapping.items()), default=default, base_preset=preset, quantize=quantize)


@dataclass
class SparseScheme:
    """The resolved scheme: a Policy for every parameter tensor, and where it came from."""

    policies: dict[str, Policy]
    source: str = "full"
    unmatched: list[str] = field(default_factory=list)  # wildcard patterns this model has nothing for
    quantize: str | None = None  # how frozen layer weights are stored (SparseUpdate.quantize)
    not_requiring_grad: list[str] = field(default_factory=list)  # frozen by the model: requires_grad=False


def _parse_preset(name, where: str = "sparse") -> tuple[str, int | None]:
    m = _PRESET.match(name) if isinstance(name, str) else None
    if not m:
        raise SparseConfigError(
            f"{where}: unknown preset {name!r}; presets: full, bias-only, last-K, mobilenet-last-K, "
            f"transformer-last-K (for example mobilenet-last-4)"
        )
    if m.group(1):
        return m.group(1), None
    k = int(m.group(3))
    if k < 1:
        raise SparseConfigError(f"{where}: preset {name!r} needs K >= 1")
    return m.group(2) or "last", k


def _parse_quantize(value, where: str) -> str | None:
    """`quantize: {frozen: int8}` -> "int8" (or int4, `int4:group=N`: quantize.parse_format)."""
    if value is None:
        return None
    if not (isinstance(value, dict) and set(value) == {"frozen"}):
        raise SparseConfigError(
            f"{where}: quantize takes {{frozen: int8}} or {{frozen: int4}} (frozen layer weights stored so), "
            f"got {value!r}"
        )
    try:
        parse_format(value["frozen"])
    except QuantizeError as e:
        raise SparseConfigError(f"{where}: {e}") from None
    return value["frozen"]


def _load(sparse) -> tuple[SparseUpdate, str]:
    """The SparseUpdate a `sparse=` argument describes, and a description of its source."""
    if isinstance(sparse, SparseUpdate):
        return sparse, f"preset {sparse.base_preset}" if sparse.base_preset and not sparse.rules else "custom"
    if isinstance(sparse, dict):
        return SparseUpdate.from_mapping(sparse), "custom"
    if isinstance(sparse, (str, os.PathLike)) and os.path.isfile(sparse):
        return SparseUpdate.from_mapping(_read_file(os.fspath(sparse)), os.fspath(sparse)), os.fspath(sparse)
    if isinstance(sparse, str) and _PRESET.match(sparse):
        return SparseUpdate(base_preset=sparse), f"preset {sparse}"
    if isinstance(sparse, str):
        raise SparseConfigError(
            f"sparse={sparse!r} is neither a preset (full, bias-only, last-K, mobilenet-last-K, "
            f"transformer-last-K) nor an existing YAML/JSON file"
        )
    raise SparseConfigError(
        f"sparse= takes None, a dict, a SparseUpdate, a preset name or a YAML/JSON path; got {sparse!r}"
    )


def _read_file(path: str) -> dict:
    text = open(path).read()
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SparseConfigError(
            f"{path}: cannot parse ({first}); in YAML, quote patterns that start with '*'"
        ) from None
    if not isinstance(data, dict):
        raise SparseConfigError(f"{path}: expected a mapping of patterns to policies, got {type(data).__name__}")
    return data


# -- model structure ------------------------------------------------------------------------


def _is_bias(name: str) -> bool:
    leaf = name.rpartition(".")[2]
    return leaf == "bias" or leaf.endswith("_bias")


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def _is_depthwise(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1 and module.groups == module.in_channels


def _is_linear(module: nn.Module) -> bool:
    """nn.Linear, or Hugging Face's Conv1D (GPT-2's linear layer, its weight transposed)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def _is_pointwise(module: nn.Module) -> bool:
    """A 1x1 ungrouped conv, or a linear over channels (ConvNeXt's, in channels-last)."""
    return _is_linear(module) or (
        isinstance(module, nn.modules.conv._ConvNd) and module.groups == 1 and all(k == 1 for k in module.kernel_size)
    )


def _is_squeeze_excite(module: nn.Module) -> bool:
    """torchvision's SqueezeExcitation, timm's SqueezeExcite, SEModule, EffectiveSEModule."""
    return re.search(r"squeeze|excit|se(module|layer|block)$", type(module).__name__.lower()) is not None


def _is_attention(module: nn.Module) -> bool:
    return "attention" in type(module).__name__.lower()


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _params_of(model: nn.Module, module_name: str, recurse: bool = True) -> list[str]:
    module = model.get_submodule(module_name)
    return [_qualified(module_name, n) for n, _ in module.named_parameters(recurse=recurse)]


def _blocks(model: nn.Module, is_core) -> list[str]:
    """Names of the blocks around `is_core` modules (see the module docstring), in order."""
    modules = dict(model.named_modules())
    core = [name for name, m in modules.items() if is_core(m)]
    # A core module nested in another (attention inside attention) is part of the outer one.
    core = [c for c in core if not any(c.startswith(o + ".") for o in core)]
    blocks = []
    for name in modules:
        parent = modules.get(name.rpartition(".")[0]) if name else None
        if not isinstance(parent, (nn.Sequential, nn.ModuleList)) or any(name.startswith(b + ".") for b in blocks):
            continue
        if len([c for c in core if c == name or c.startswith(name + ".")]) == 1:
            blocks.append(name)
    return blocks


def _layers(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(name, module, its parameters) of every parameter-holding layer, in definition order. A
    stacked recurrent module (nn.GRU, nn.LSTM, nn.RNN with num_layers > 1) holds one layer per
    stack level, both directions in it: its parameters end in _l<i> or _l<i>_reverse."""
    layers = []
    for name, m in model.named_modules():
        own = _params_of(model, name, recurse=False)
        if own and isinstance(m, nn.RNNBase) and m.num_layers > 1:
            for i in range(m.num_layers):
                level = [n for n in own if re.search(rf"_l{i}(_reverse)?$", n)]
                layers.append((f"{name}[layer {i}]", m, level))
        elif own:
            layers.append((name, m, own))
    return layers


def _last_layers(model: nn.Module, k: int) -> list[str]:
    layers = _layers(model)
    compute = [i for i, (_, m, _) in enumerate(layers) if not _is_norm(m)]
    if k > len(compute):
        raise SparseConfigError(
            f"preset 'last-{k}': the model has only {len(compute)} layers ({', '.join(layers[i][0] for i in compute)})"
        )
    return [n for _, _, params in layers[compute[-k] :] for n in params]


def _block_parameters(model: nn.Module, family: str, k: int) -> list[str]:
    """The parameters a mobilenet-/transformer-last-k preset updates inside the last k blocks."""
    is_core = _is_depthwise if family == "mobilenet" else _is_attention
    what = "depthwise-conv blocks" if family == "mobilenet" else "attention blocks"
    blocks = _blocks(model, is_core)
    if not blocks:
        types = sorted({type(m).__name__ for m in model.modules()})
        raise SparseConfigError(
            f"preset '{family}-last-{k}' found no {what} in the model (module types: "
            f"{', '.join(types)}); use last-K or patterns instead"
        )
    if k > len(blocks):
        raise SparseConfigError(
            f"preset '{family}-last-{k}': the model has only {len(blocks)} {what} ({', '.join(blocks)})"
        )
    chosen = []
    for block in blocks[-k:]:
        members = [(_qualified(block, n), m) for n, m in model.get_submodule(block).named_modules()]
        if family == "mobilenet":
            excite = [name for name, m in members if _is_squeeze_excite(m)]
            pointwise = next(
                (name for name, m in members if _is_pointwise(m) and not any(name.startswith(e + ".") for e in excite)),
                None,
            )
            if pointwise is None:
                raise SparseConfigError(f"preset 'mobilenet-last-{k}': block {block} has no pointwise (1x1) conv")
            chosen += _params_of(model, pointwise)
            continue
        attention = next(name for name, m in members if is_core(m))
        chosen += _params_of(model, attention)
        ffn = next((name for name, m in members if _is_linear(m) and not name.startswith(attention + ".")), None)
        if ffn is not None:
            chosen += _params_of(model, ffn)
    return chosen


def preset_parameters(preset: str, model: nn.Module | None, names: list[str]) -> list[str]:
    """The parameters a preset updates in full (every other one is frozen)."""
    family, k = _parse_preset(preset)
    biases = [n for n in names if _is_bias(n)]
    if family == "full":
        return list(names)
    if family == "bias-only":
        if not biases:
            raise SparseConfigError("preset 'bias-only': the model has no bias parameters")
        return biases
    if model is None:
        raise SparseConfigError(
            f"preset '{preset}' reads the model's structure; without the PyTorch model "
            f"(pock-opt) use patterns, full or bias-only"
        )
    if family == "last":
        return _last_layers(model, k)
    chosen = biases + _block_parameters(model, family, k)
    if family == "transformer":
        chosen += [
            n for name, m in model.named_modules() if _is_norm(m) for n in _params_of(model, name, recurse=False)
        ]
    return [n for n in names if n in set(chosen)]


# -- resolution -----------------------------------------------------------------------------


def _matches(pattern: str, name: str) -> bool:
    """A pattern names a parameter or any module that contains it."""
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:i]), pattern) for i in range(1, len(parts) + 1))


def _closest(pattern: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(pattern, candidates, n=5, cutoff=0.3)
    return ", ".join(close or candidates[:8]) or "none"


def _module_names(names: list[str]) -> list[str]:
    modules = {}
    for n in names:
        parts = n.split(".")
        for i in range(1, len(parts)):
            modules.setdefault(".".join(parts[:i]))
    return list(modules)


def _lora_policy(value, where: str) -> LoraPolicy | None:
    try:
        return LoraPolicy.parse(value, where)
    except LoraError as e:
        raise SparseConfigError(str(e)) from None


def _lora_targets(pattern: str, modules: list[str]) -> list[str]:
    """The modules a LoRA pattern adapts: those it names, by themselves, by their weight or by a
    module containing them."""
    return [m for m in modules if _matches(pattern, m) or fnmatch.fnmatchcase(f"{m}.weight", pattern)]


def lora_adapters(sparse, model: nn.Module | None) -> list[Adapter]:
    """The LoRA adapters `sparse` asks for, in the model's module order (the last LoRA pattern
    naming a module sets its r and alpha); [] for a scheme without LoRA."""
    if sparse is None:
        return []
    scheme, _ = _load(sparse)
    rules = [(pattern, _lora_policy(value, f"pattern '{pattern}'")) for pattern, value in scheme.rules]
    rules = [(pattern, policy) for pattern, policy in rules if policy is not None]
    if rules and not isinstance(model, nn.Module):
        raise SparseConfigError(
            "LoRA policies add adapters to the PyTorch model: compile its nn.Module with compile_training or "
            "pock-compile (an ONNX model, or pock-opt on bare IR, takes patterns without LoRA)"
        )
    if not rules:
        return []
    kinds = {name: adapter_kind(m) for name, m in model.named_modules()}
    adaptable = [name for name, kind in kinds.items() if kind]
    chosen: dict[str, Adapter] = {}
    for pattern, policy in rules:
        targets = _lora_targets(pattern, adaptable)
        if not targets and not _is_wildcard(pattern):
            named = [n for n in kinds if _matches(pattern, n)]
            found = ", ".join(f"{n} ({type(model.get_submodule(n)).__name__})" for n in named[:3]) or "nothing"
            raise SparseConfigError(
                f"pattern '{pattern}': LoRA applies to nn.Linear, Hugging Face Conv1D and ungrouped nn.Conv2d, and the "
                f"pattern names {found}; closest adaptable modules: {_closest(pattern, adaptable)}"
            )
        for name in targets:
            shape = tuple(model.get_submodule(name).weight.shape)
            chosen[name] = Adapter(name, kinds[name], shape, policy.r, policy.alpha, policy.seed)
    return [chosen[name] for name in adaptable if name in chosen]


def _apply(
    value, matched: list[str], shapes: dict[str, tuple], pattern: str | None, policies: dict[str, Policy]
) -> None:
    """Set the policy `value` on the `matched` parameters (by `pattern`, None for default)."""
    where = "default" if pattern is None else f"pattern '{pattern}'"
    if _lora_policy(value, where) is not None:
        if pattern is None:
            raise SparseConfigError("default: LoRA is a policy for patterns; name the modules to adapt")
        adapters = _lora_targets(
            pattern, [n.removesuffix(".lora_A.weight") for n in shapes if n.endswith(".lora_A.weight")]
        )
        trained = {f"{m}.lora_{part}.weight" for m in adapters for part in "AB"}
        policies.update({n: Policy("full" if n in trained else "frozen") for n in {*matched, *trained}})
    elif value in ("full", "frozen"):
        policies.update({n: Policy(value) for n in matched})
    elif value == "bias":
        if not any(_is_bias(n) for n in matched):
            with_bias = [n.rpartition(".")[0] for n in shapes if _is_bias(n)]
            raise SparseConfigError(
                f"{where}: policy 'bias', but it matches no bias parameter ({', '.join(matched[:4])}); "
                f"closest modules with a bias: {_closest(pattern or '', with_bias)}"
            )
        policies.update({n: Policy("full" if _is_bias(n) else "frozen") for n in matched})
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= 1:
            raise SparseConfigError(f"{where}: channel ratio must be in (0, 1], got {value}")
        for n in matched:
            shape = shapes[n]
            if not shape:
                raise SparseConfigError(
                    f"{where}: ratio {value} on {n}, a scalar with no output-channel dimension; give it full or frozen"
                )
            policy = Policy("channels", float(value))
            policies[n] = policy if policy.channels(shape) < shape[0] else Policy("full")
    else:
        raise SparseConfigError(
            f"{where}: unknown policy {value!r}; use full, frozen, bias, a ratio in (0, 1] or lora:r=8,alpha=16"
        )


def resolve_sparse(sparse, model: nn.Module | None, params: dict[str, tuple]) -> SparseScheme:
    """A Policy for each parameter (given by name with its shape) under `sparse`; `model` is
    read only by the structural presets (last-K, mobilenet-last-K, transformer-last-K)."""
    names = list(params)
    if sparse is None:
        return _frozen_by_model(SparseScheme({n: Policy("full") for n in names}, "full"), model)
    scheme, source = _load(sparse)
    rules = list(scheme.rules)
    if scheme.base_preset is not None:
        rules = [(n, "full") for n in preset_parameters(scheme.base_preset, model, names)] + rules
    policies: dict[str, Policy] = {}
    _apply(scheme.default, names, params, None, policies)
    candidates = names + _module_names(names)
    unmatched = []
    adapted = [n.removesuffix(".lora_A.weight") for n in names if n.endswith(".lora_A.weight")]
    for pattern, value in rules:
        matched = [n for n in names if _matches(pattern, n)]
        if _lora_policy(value, f"pattern '{pattern}'") and not _lora_targets(pattern, adapted):
            matched = []  # it adapts nothing here (lora_adapters rejected an exact name already)
        if not matched and _is_wildcard(pattern):  # one scheme serves a family: not every model has everything
            unmatched.append(pattern)
            continue
        if not matched:
            raise SparseConfigError(
                f"pattern '{pattern}' matches no parameter or module; closest names: {_closest(pattern, candidates)}"
            )
        _apply(value, matched, params, pattern, policies)
    return _frozen_by_model(SparseScheme(policies, source, unmatched, scheme.quantize), model)


def _frozen_by_model(scheme: SparseScheme, model: nn.Module | None) -> SparseScheme:
    """`scheme` with the parameters the model freezes the PyTorch way (requires_grad=False, as PEFT
    freezes a base model) frozen, whatever it said: torch.optim updates only what gets a gradient."""
    if model is not None:
        scheme.not_requiring_grad = [
            n for n, p in model.named_parameters() if not p.requires_grad and n in scheme.policies
        ]
        scheme.policies.update({n: Policy("frozen") for n in scheme.not_requiring_grad})
    return scheme


def _is_wildcard(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")
