"""LoRA adapters as an update policy, with PEFT's arithmetic, initialisation and file format.

A sparse-config pattern with the policy `{lora: {r: 8, alpha: 16}}` (or the string
`lora:r=8,alpha=16`; `lora` alone takes PEFT's defaults r = 8, alpha = 8) gives every
nn.Linear, Hugging Face Conv1D (GPT-2's linear, its weight stored [in, out]) and ungrouped
nn.Conv2d it names (or contains) an adapter, as PEFT's LoRA layer computes it:

    y = base(x) + (alpha / r) * B(A(x))

A is a linear (r, in) or, for a conv, a conv with the base's kernel, stride, padding and
dilation to r channels; B is a linear (out, r) or a 1x1 conv. The frontend adds A and B to the
traced forward pass as parameters named `<module>.lora_A.weight` and `<module>.lora_B.weight`
(forward hooks during export; the user's model is left as it was); the scheme trains A and B
and freezes the module's own parameters, so the backward, the optimizer state and the saved
activations exist only for what LoRA needs. A is Kaiming-uniform (a = sqrt(5), as PEFT and
nn.Linear initialise) from a generator seeded with the policy's `seed` (default 0) and the
module's name, B is zero.

This module needs neither PyTorch nor torch-mlir, so devices merge and export adapters with
numpy alone; what the compiler does with a PyTorch model's adapted layers (which ones apply, PEFT's
initial values, the forward hooks of tracing) is in pock_mlir/layers.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pock_mlir.abi import KINDS
from pock_mlir.quantize import dequantized

DEFAULT_R, DEFAULT_ALPHA = 8, 8.0  # PEFT's LoraConfig defaults
PEFT_PREFIX = "base_model.model."  # where PeftModel keeps the wrapped model's modules


class LoraError(ValueError):
    """A LoRA policy or adapter export that cannot be honoured, with the fix."""


@dataclass(frozen=True)
class LoraPolicy:
    r: int = DEFAULT_R
    alpha: float = DEFAULT_ALPHA
    seed: int = 0

    @staticmethod
    def parse(value, where: str) -> LoraPolicy | None:
        """The LoRA policy `value` states ({lora: {...}}, "lora" or "lora:r=8,alpha=16"), None
        if it states another policy."""
        if isinstance(value, str) and (value == "lora" or value.startswith("lora:")):
            fields = {}
            for item in filter(None, value[len("lora:") :].split(",")):
                key, equals, number = item.partition("=")
                if not equals:
                    raise LoraError(f"{where}: {value!r}: write lora:r=8,alpha=16 (key=value pairs)")
                fields[key.strip()] = number.strip()
        elif isinstance(value, dict) and set(value) == {"lora"}:
            fields = value["lora"] or {}
            if not isinstance(fields, dict):
                raise LoraError(f"{where}: lora takes a mapping such as {{r: 8, alpha: 16}}, got {fields!r}")
        else:
            return None
        unknown = sorted(set(fields) - {"r", "alpha", "seed"})
        if unknown:
            raise LoraError(
                f"{where}: unknown LoRA option(s) {', '.join(map(str, unknown))}; options are r, alpha, seed"
            )
        try:
            r, alpha, seed = (
                int(fields.get("r", DEFAULT_R)),
                float(fields.get("alpha", DEFAULT_ALPHA)),
                int(fields.get("seed", 0)),
            )
        except (TypeError, ValueError):
            raise LoraError(f"{where}: LoRA r and seed must be integers and alpha a number, got {fields}") from None
        if r < 1 or not math.isfinite(alpha) or alpha <= 0:
            raise LoraError(f"{where}: LoRA needs r >= 1 and alpha > 0, got r={r}, alpha={alpha}")
        return LoraPolicy(r, alpha, seed)


@dataclass(frozen=True)
class Adapter:
    """One adapted module: its name and kind, the base weight's shape and the policy."""

    module: str
    kind: str  # one of KINDS
    weight_shape: tuple[int, ...]  # the base weight as the module stores it
    r: int
    alpha: float
    seed: int = 0

    @property
    def weight(self) -> str:
        return f"{self.module}.weight"

    @property
    def a(self) -> str:
        return f"{self.module}.lora_A.weight"

    @property
    def b(self) -> str:
        return f"{self.module}.lora_B.weight"

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    @property
    def a_shape(self) -> tuple[int, ...]:
        if self.kind == "conv":
            return (self.r, *self.weight_shape[1:])
        return (self.r, self.weight_shape[0 if self.kind == "conv1d" else 1])

    @property
    def b_shape(self) -> tuple[int, ...]:
        if self.kind == "conv":
            return (self.weight_shape[0], self.r, 1, 1)
        return (self.weight_shape[1 if self.kind == "conv1d" else 0], self.r)

    def delta(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """What merging adds to the base weight, in its layout: scale * B @ A."""
        product = self.scale * (b.reshape(b.shape[0], self.r) @ a.reshape(self.r, -1))
        if self.kind == "conv1d":
            return product.T
        return product.reshape(self.weight_shape)

    def to_json(self) -> dict:
        return {**asdict(self), "weight_shape": list(self.weight_shape)}

    @staticmethod
    def from_json(entry: dict) -> Adapter:
        if entry.get("kind") not in KINDS:
            raise ValueError(f"adapter {entry.get('module')!r}: kind must be one of {', '.join(KINDS)}")
        return Adapter(
            str(entry["module"]),
            entry["kind"],
            tuple(int(d) for d in entry["weight_shape"]),
            int(entry["r"]),
            float(entry["alpha"]),
            int(entry.get("seed", 0)),
        )


def names(adapters: list[Adapter]) -> set[str]:
    return {name for adapter in adapters for name in (adapter.a, adapter.b)}


def merged(state: dict[str, np.ndarray], adapters: list[Adapter]) -> dict[str, np.ndarray]:
    """`state` with each adapter merged into its base weight and the adapter tensors removed:
    the model's own parameters, as PEFT's merge_and_unload leaves them."""
    result = {name: value for name, value in state.items() if name not in names(adapters)}
    for adapter in adapters:
        base = result[adapter.weight]
        result[adapter.weight] = (base + adapter.delta(state[adapter.a], state[adapter.b])).astype(base.dtype)
    return result


def model_state(signature, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Parameters by name as the PyTorch model of `signature` (an abi.StepSignature) holds them:
    int8 weights dequantized, LoRA adapters merged into their weights (PEFT's merge_and_unload)."""
    return merged(dequantized(state, signature.quantized), signature.adapters)


def torch_state_dict(signature, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The PyTorch model's state_dict, exactly its keys (signature.state_dict), from the parameters
    and buffers of `signature` by name: LoRA adapters merged, int8 weights dequantized."""
    held = model_state(signature, state)
    return {key: held[source] for key, source in signature.state_dict.items()}


def _module_of(params, adapters: list[Adapter]) -> dict[str, str]:
    return {name: name.rpartition(".")[0] for name in params if name not in names(adapters)}


def check_exportable(params, adapters: list[Adapter], trainable: list[str]) -> None:
    """Raise LoraError unless PEFT's adapter format can hold what the scheme trains."""
    if not adapters:
        raise LoraError("the scheme has no LoRA adapters to export (export the state_dict instead)")
    module_of, adapted = _module_of(params, adapters), {adapter.module for adapter in adapters}
    inside = [name for name in trainable if module_of.get(name) in adapted]
    if inside:
        raise LoraError(
            f"the scheme also trains {', '.join(inside[:3])}, in an adapted module, which PEFT's "
            f"adapter format cannot hold; export the merged state_dict instead"
        )


def peft_adapter(
    params: dict[str, np.ndarray], adapters: list[Adapter], trainable: list[str]
) -> tuple[dict[str, np.ndarray], dict]:
    """(adapter_model.safetensors tensors, adapter_config.json) as PEFT saves them, from the
    parameters by name: the adapters, plus every module holding another trained parameter as a
    PEFT `modules_to_save` entry (its parameters whole)."""
    check_exportable(params, adapters, trainable)
    module_of, adapted = _module_of(params, adapters), {adapter.module for adapter in adapters}
    others = [name for name in trainable if name not in names(adapters)]
    saved = sorted({module_of[name] for name in others})
    tensors = {
        f"{PEFT_PREFIX}{adapter.module}.lora_{part}.weight": params[getattr(adapter, part.lower())]
        for adapter in adapters
        for part in ("A", "B")
    }
    tensors.update({f"{PEFT_PREFIX}{name}": params[name] for name, module in module_of.items() if module in saved})
    first = adapters[0]
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": None,
        "inference_mode": True,
        "r": first.r,
        "lora_alpha": first.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "init_lora_weights": True,
        "fan_in_fan_out": any(adapter.kind == "conv1d" for adapter in adapters),
        "target_modules": sorted(adapted),
        "modules_to_save": saved or None,
        "rank_pattern": {adapter.module: adapter.r for adapter in adapters if adapter.r != first.r},
        "alpha_pattern": {adapter.module: adapter.alpha for adapter in adapters if adapter.alpha != first.alpha},
    }
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}, config


def check_adapter_directory(directory) -> Path:
    """Refuse, before any work, an adapter directory that cannot be written."""
    from pock_mlir.files import OutputError, check_writable

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"cannot export adapters to {directory}: it is a file; give a directory")
    check_writable(directory / "adapter_config.json" if directory.is_dir() else directory)
    return directory


def write_peft_adapter(directory, tensors: dict[str, np.ndarray], config: dict) -> Path:
    """Write adapter_model.safetensors and adapter_config.json into `directory` (made if
    missing), each atomically; `peft.PeftModel.from_pretrained(model, directory)` loads them."""
    from safetensors.numpy import save

    from pock_mlir.files import atomic_write

    directory = check_adapter_directory(directory)
    directory.mkdir(exist_ok=True)
    atomic_write(directory / "adapter_model.safetensors", save(tensors, metadata={"format": "pt"}))
    atomic_write(directory / "adapter_config.json", json.dumps(config, indent=2) + "\n")
    return directory
