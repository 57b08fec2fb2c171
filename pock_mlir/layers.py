"""The PyTorch layers whose weights LoRA adapts and int8 stores, at compile time: what kind each
is (by its weight layout, abi.KINDS), which weights int8 stores, PEFT's initial adapter values,
and the forward changes through which the frontend traces adapters and int8 weights into the
step. The runtime needs none of it: pock_mlir/lora.py and pock_mlir/quantize.py hold what a
device does with adapters and int8 weights, with numpy alone.
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
from pock_mlir.quantize import QuantizedWeight


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


def frozen_weights(model, policies: dict) -> list[QuantizedWeight]:
    """The weights int8 holds under `policies`: each frozen weight of a linear, Conv1D or conv
    layer that no other module shares."""
    owners: dict[int, int] = {}
    for _, tensor in model.named_parameters(remove_duplicate=False):
        owners[id(tensor)] = owners.get(id(tensor), 0) + 1
    chosen = []
    for name, module in model.named_modules():
        kind, weight = kind_of(module), getattr(module, "weight", None)
        policy = policies.get(f"{name}.weight")
        if kind and weight is not None and policy is not None and policy.kind == "frozen" and owners[id(weight)] == 1:
            chosen.append(QuantizedWeight(name, kind, tuple(weight.shape)))
    return chosen


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


@contextlib.contextmanager
def int8_attached(model, quantized: list[QuantizedWeight], tensors: dict):
    """The quantized modules compute with their int8 weights, read from `tensors` at each call:
    how the frontend traces them into the step. The user's model is restored afterwards."""

    def forward_for(module, weight: QuantizedWeight):
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

    modules = [(model.get_submodule(w.module), w) for w in quantized]
    for module, weight in modules:
        module.forward = forward_for(module, weight)  # an instance attribute: hooks still run around it
    try:
        yield
    finally:
        for module, _ in modules:
            del module.forward
