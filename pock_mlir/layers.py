"""The PyTorch layers whose weights LoRA adapts and int8 or int4 stores, at compile time: what
kind each is (by its weight layout, abi.KINDS), which weights int8 and int4 store, PEFT's initial
adapter values, and the forward changes through which the frontend traces adapters and quantized
weights into the step. The runtime needs none of it: pock_mlir/lora.py and pock_mlir/quantize.py
hold what a device does with adapters and quantized weights, with numpy alone.
"""

from __future__ import annotations

import contextlib
import math
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from pock_mlir.lora import Adapter
from pock_mlir.quantize import QuantizedWeight, QuantizeError, parse_format


def kind_of(module) -> str | None:
    """The kind of a PyTorch module, None for a module of none of them."""
    if isinstance(module, nn.Linear):
        return "linear"
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None and module.weight.dim() == 2:
        return "conv1d"  # GPT-2's linear: y = x @ W + b
    if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros":
        return "conv"
    return None


def adapter_kind(module) -> str | None:
    """The adapter kind for a PyTorch module, None if LoRA does not apply to it (grouped convs)."""
    kind = kind_of(module)
    return None if kind == "conv" and module.groups != 1 else kind


def frozen_weights(model, policies: dict, quantize: str) -> list[QuantizedWeight]:
    """The weights `quantize` (a format, quantize.parse_format) holds under `policies`: each frozen
    weight of a linear, Conv1D or conv layer that no other module shares; under int4, of linears,
    Conv1Ds and embeddings (no conv), a weight tied between embeddings and linear heads included."""
    fmt, group = parse_format(quantize)
    keys: dict[int, list[str]] = {}  # each parameter's names, a tied one's several
    for key, tensor in model.named_parameters(remove_duplicate=False):
        keys.setdefault(id(tensor), []).append(key)
    chosen = []
    for name, module in model.named_modules():
        weight, kind = getattr(module, "weight", None), _quantized_kind(module, fmt)
        policy = policies.get(f"{name}.weight")
        # the first name of a parameter is its own (named_parameters), the others tie to it
        if (
            kind is None
            or policy is None
            or policy.kind != "frozen"
            or keys.get(id(weight), [""])[0] != f"{name}.weight"
        ):
            continue
        tied = tuple(key.removesuffix(".weight") for key in keys[id(weight)][1:])
        if tied and (fmt != "int4" or not all(_tieable(model, key) for key in keys[id(weight)])):
            continue  # int8 keeps shared weights float32; int4 shares one between embeddings and heads
        if fmt == "int4":
            inputs = weight.shape[0 if kind == "conv1d" else 1]
            if inputs % group:
                raise QuantizeError(
                    f"int4:group={group} needs each quantized layer's input size to be a multiple of {group}, "
                    f"but {name} has {inputs}; choose a group that divides it (quantize: {{frozen: 'int4:group=N'}})"
                )
        chosen.append(QuantizedWeight(name, kind, tuple(weight.shape), fmt, group, tied))
    return chosen


def _quantized_kind(module, fmt: str) -> str | None:
    """The kind of a module whose weight `fmt` stores, None if it stores none of it."""
    if fmt == "int4" and isinstance(module, nn.Embedding) and module.max_norm is None and not module.sparse:
        return "embedding"  # (max_norm renormalizes the weight in place, sparse gradients have no packed form)
    kind = kind_of(module)
    return None if fmt == "int4" and kind == "conv" else kind


def _tieable(model, key: str) -> bool:
    """Whether int4 can hold the parameter `key` in one packed tensor with its other names': the
    weight of an embedding or a linear, which hold rows over the input dimension alike."""
    module = model.get_submodule(key.removesuffix(".weight")) if key.endswith(".weight") else None
    return isinstance(module, (nn.Embedding, nn.Linear)) and _quantized_kind(module, "int4") is not None


def initial_adapter_values(adapters: list[Adapter]) -> dict[str, np.ndarray]:
    """PEFT's initialisation: A Kaiming-uniform (a = sqrt(5)), B zero; each adapter's A drawn
    from its own generator, seeded with the policy's seed and the module's name, so adding an
    adapter changes no other."""
    values = {}
    for adapter in adapters:
        generator = torch.Generator().manual_seed(adapter.seed * 2**32 + zlib.crc32(adapter.module.encode()))
        a = torch.empty(adapter.a_shape)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        values[adapter.a] = a.numpy()
        values[adapter.b] = np.zeros(adapter.b_shape, np.float32)
    return values


@contextlib.contextmanager
def adapters_attached(model, adapters: list[Adapter], tensors: dict):
    """The model's adapted modules add scale * B(A(x)) to their outputs, A and B read from
    `tensors` (by adapter name) at each call: how the frontend traces adapters into the step."""

    def hook_for(adapter: Adapter):
        def add_adapter(module, args, output):
            x, a, b = args[0], tensors[adapter.a], tensors[adapter.b]
            if adapter.kind == "conv":
                low = F.conv2d(x, a, None, module.stride, module.padding, module.dilation)
                return output + adapter.scale * F.conv2d(low, b)
            return output + adapter.scale * F.linear(F.linear(x, a), b)

        return add_adapter

    handles = [model.get_submodule(adapter.module).register_forward_hook(hook_for(adapter)) for adapter in adapters]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The int4 values of packed bytes, as float32 in [-7, 7], along a new last axis of 2 (the
    low nibble's first): each byte shifted by 0 and 4, masked to its nibble, less 8."""
    shifts = torch.tensor([0, 4], dtype=packed.dtype)
    return torch.bitwise_and(torch.bitwise_right_shift(packed[..., None], shifts), 15).to(torch.float32) - 8


def int4_rows(packed: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """The float32 values of int4 rows (quantize.py's layout: [..., in/2] bytes, [..., in/G] scales)."""
    grouped = _nibbles(packed).reshape(*packed.shape[:-1], scale.shape[-1], group) * scale[..., None]
    return grouped.flatten(-2)


@torch.library.custom_op("pock::int4_linear", mutates_args=())
def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """x @ W^T for the int4 weight W ([out, in/2] bytes, [out, in/G] scales), one op in the traced
    step: pock-autodiff differentiates it and pock-expand-custom expands it into matmuls over
    chunks of W (pock_mlir/autodiff/rules/quantized.py), so W is never whole in float32."""
    return F.linear(x, int4_rows(packed, scale, group))


@int4_linear.register_fake
def _(x, packed, scale, group):
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


@contextlib.contextmanager
def quantized_attached(model, quantized: list[QuantizedWeight], tensors: dict):
    """The quantized modules compute with their int8 or int4 weights, read from `tensors` at each
    call: how the frontend traces them into the step. The user's model is restored afterwards."""

    def int8_forward(module, weight: QuantizedWeight):
        def forward(x):
            q, scale = tensors[weight.values].to(x.dtype), tensors[weight.scale]
            bias = module.bias
            if weight.kind == "conv":
                y = F.conv2d(x, q, None, module.stride, module.padding, module.dilation, module.groups)
                y = y * scale[:, None, None]
                return y if bias is None else y + bias[:, None, None]
            y = (F.linear(x, q) if weight.kind == "linear" else torch.matmul(x, q)) * scale
            return y if bias is None else y + bias

        return forward

    def int4_forward(module, weight: QuantizedWeight):
        def forward(x):
            packed, scale = tensors[weight.values], tensors[weight.scale]
            if isinstance(module, nn.Embedding):  # the looked-up rows only, then unpacked
                return int4_rows(F.embedding(x, packed), F.embedding(x, scale), weight.group)
            y = int4_linear(x, packed, scale, weight.group)
            return y if module.bias is None else y + module.bias

        return forward

    modules = [(model.get_submodule(name), w) for w in quantized for name in (w.module, *w.tied)]
    for module, weight in modules:
        forward_for = int4_forward if weight.format == "int4" else int8_forward
        module.forward = forward_for(module, weight)  # an instance attribute: hooks still run around it
    try:
        yield
    finally:
        for module, _ in modules:
            del module.forward
