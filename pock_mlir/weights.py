"""A model's starting weights read from safetensors files instead of from the model itself.

`compile_training(model, ..., weights=PATH)` takes PATH as a Hugging Face model directory
(config.json with model.safetensors, or the shards model.safetensors.index.json names) or one
.safetensors file. The model may live on the meta device (built from its config alone, with no
memory for its weights): the frontend traces it on meta tensors, and nothing reads a weight until
the Trainer uploads it or the bundle writer writes it. Then each tensor is read from its
memory-mapped file, converted to the parameter's dtype (bfloat16 and float16 files to float32),
passed through the int8 quantizer where the scheme stores it so (QuantizedWeight.quantize, one
tensor at a time), and dropped once on the device or in the bundle: the host never holds a second
copy of the model.

The files are checked against the model before any work: every tensor of the model's state_dict
must be there (a tied weight, e.g. lm_head.weight tied to embed_tokens.weight, under any of its
keys: Hugging Face leaves the tied copy out), with its shape, and nothing else. Buffers, small, are
read at once; a non-persistent one (a rotary table) is no checkpoint's: it is the model's own value
or, on the meta device, the one the model's Hugging Face initialisation computes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from pock_mlir import layers, quantize
from pock_mlir.frontend import state_dict_sources

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class WeightsError(ValueError):
    """The weights= files cannot give the model its weights; the message names the file or tensor."""


def _key_files(path: Path) -> dict[str, Path]:
    """Each tensor name of the checkpoint at `path` and the file that holds it."""
    if not path.exists():
        raise WeightsError(f"weights={path}: no such file or directory")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise WeightsError(
                f"weights={path}: not a .safetensors file; give a Hugging Face model directory or a .safetensors file"
            )
        files = [path]
    elif (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise WeightsError(f"weights={path}: {INDEX} has no readable weight_map ({e})") from None
        files = sorted({path / name for name in weight_map.values()})
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise WeightsError(f"weights={path}: {INDEX} names shard(s) the directory lacks: {', '.join(absent)}")
    elif (path / SINGLE).is_file():
        files = [path / SINGLE]
    else:
        found = sorted(p.name for p in path.glob("*.safetensors"))
        hint = f" (it holds {', '.join(found[:3])}: give one of them)" if found else ""
        raise WeightsError(
            f"weights={path}: a Hugging Face model directory holds {SINGLE} or {INDEX}, this one neither{hint}"
        )
    keys: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
        except Exception as e:
            raise WeightsError(f"weights={path}: {file.name} is not a readable safetensors file ({e})") from None
        keys.update(dict.fromkeys(names, file))
    return keys


class Checkpoint:
    """The tensors of a checkpoint by name, read one at a time from memory-mapped files."""

    def __init__(self, path):
        self.path = Path(path)
        self.files = _key_files(self.path)

    def header(self, key: str) -> tuple[tuple[int, ...], str]:
        """The tensor's shape and safetensors dtype (F32, BF16, ...), from its file's header alone."""
        with safe_open(self.files[key], framework="pt") as f:
            entry = f.get_slice(key)
            return tuple(entry.get_shape()), entry.get_dtype()

    def read(self, key: str, dtype: torch.dtype) -> np.ndarray:
        """The tensor `key` as a numpy array of `dtype` (a float file converted to a float dtype)."""
        with safe_open(self.files[key], framework="pt") as f:
            tensor = f.get_tensor(key)
        return tensor.to(dtype).numpy()

    def sources(self, model: torch.nn.Module) -> dict[str, str]:
        """For each parameter and buffer of `model` its checkpoint says anything of (by its
        named_parameters/named_buffers name), the key that holds it; WeightsError naming the first
        tensor the files lack, hold beyond the model, or hold in another shape."""
        keys_of: dict[str, list[str]] = {}
        for key, name in state_dict_sources(model).items():
            keys_of.setdefault(name, []).append(key)
        unexpected = sorted(set(self.files) - {k for keys in keys_of.values() for k in keys})
        if unexpected:
            raise WeightsError(
                f"weights={self.path}: {unexpected[0]} is not a tensor of the model"
                f"{f' ({len(unexpected) - 1} more)' if len(unexpected) > 1 else ''}: the files are of another "
                f"model or configuration"
            )
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        sources = {}
        for name, keys in keys_of.items():
            key = next((k for k in keys if k in self.files), None)
            if key is None:
                raise WeightsError(
                    f"weights={self.path}: the files hold no tensor {keys[0]}: the checkpoint is incomplete "
                    f"or of another model"
                )
            (shape, dtype), want = self.header(key), tuple(tensors[name].shape)
            if shape != want:
                raise WeightsError(f"weights={self.path}: {key} has shape {shape}, the model's is {want}")
            if tensors[name].dtype in FLOATS and dtype not in ("F32", "F16", "BF16", "F64"):
                raise WeightsError(f"weights={self.path}: {key} is {dtype}, the model's is a float tensor")
            sources[name] = key
        return sources


def _non_persistent_values(model: torch.nn.Module, meta: list[str]) -> dict[str, torch.Tensor]:
    """The values of the non-persistent buffers `meta` (on the meta device) as the model's Hugging
    Face initialisation computes them (what from_pretrained does for rotary tables)."""
    if not meta:
        return {}
    if not callable(getattr(model, "_init_weights", None)):
        raise WeightsError(
            f"buffer {meta[0]} is on the meta device and in no checkpoint (a non-persistent buffer): "
            f"build the model with its buffers on the CPU, or give it a value before compiling"
        )
    values = {}
    owners = {name.rpartition(".")[0] for name in meta}
    for owner in owners:
        module = model.get_submodule(owner)
        saved = dict(module._buffers)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.empty_like(buffer, device="cpu")
        try:
            model._init_weights(module)
            values.update({f"{owner}.{n}" if owner else n: b.detach().clone() for n, b in module._buffers.items()})
        finally:
            module._buffers.update(saved)  # the user's model stays as it was built
    return {name: values[name] for name in meta}


class Weights:
    """The checkpoint of compile_training's weights=, checked against the model: the buffers'
    values, and the program's initial parameters as a mapping that reads each when asked."""

    def __init__(self, path, model: torch.nn.Module):
        if not isinstance(model, torch.nn.Module):
            raise WeightsError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.checkpoint = Checkpoint(path)
        self.sources = self.checkpoint.sources(model)
        buffers = dict(model.named_buffers())
        meta = [n for n, b in buffers.items() if n not in self.sources and b.is_meta]
        computed = _non_persistent_values(model, meta)
        self.buffers = {
            name: (
                torch.from_numpy(self.checkpoint.read(self.sources[name], b.dtype))
                if name in self.sources
                else computed.get(name, b.detach())
            )
            for name, b in buffers.items()
        }
        self.dtypes = {n: p.dtype for n, p in model.named_parameters()}

    def initial_params(self, rewrites) -> InitialParams:
        return InitialParams(self, rewrites)


class InitialParams(Mapping):
    """The program's initial parameters by name, each read (and converted, and quantized) from the
    checkpoint when asked and not kept: the Trainer and the bundle writer hold one at a time."""

    def __init__(self, weights: Weights, rewrites):
        self.weights = weights
        self.quantized = {name: w for w in rewrites.quantized for name in (w.values, w.scale)}
        self.adapters = layers.initial_adapter_values(list(rewrites.adapters))  # small, made at once
        int8 = {w.weight for w in rewrites.quantized}
        self.names = [n for n in weights.dtypes if n not in int8] + list(self.quantized) + list(self.adapters)
        self.pending: dict[str, np.ndarray] = {}  # the other half of an int8 weight quantized for one half

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.adapters:
            return self.adapters[name]
        if name in self.pending:
            return self.pending.pop(name)
        weight: quantize.QuantizedWeight | None = self.quantized.get(name)
        source = weight.weight if weight else name
        if source not in self.weights.dtypes:
            raise KeyError(name)
        value = self.weights.checkpoint.read(self.weights.sources[source], self.weights.dtypes[source])
        if weight is None:
            return value
        parts = weight.quantize(value)
        self.pending.update({n: v for n, v in parts.items() if n != name})
        return parts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
