"""Trainer.export_pretrained: the tuned model as a Hugging Face model directory, without PyTorch.

    DIR/
      config.json                       the model's config as compiled (the bundle's hf/), its
      generation_config.json            dtype that of the weights written
      model.safetensors                 the model's state_dict (its keys, a tied weight once);
                                        over max_shard_size: model-00001-of-0000N.safetensors ... and
      model.safetensors.index.json      which file holds each key, as save_pretrained shards
      adapter_config.json               lora="peft" only: the LoRA adapters in PEFT's format; the
      adapter_model.safetensors         weights above are then the base they were trained on

`AutoModelForCausalLM.from_pretrained(DIR)` (any Auto class of the model) loads it; with
lora="peft", transformers (with peft installed) loads the adapters onto the base it holds, and
`peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(DIR), DIR)` does the same
by hand. int8 weights are written dequantized (q * scale), LoRA adapters merged into their
weights (W + alpha/r * B @ A, PEFT's merge_and_unload) unless lora="peft".

The weights stream from the device to the file one tensor at a time (the header, whose offsets
follow from the shapes, first): the host holds one tensor at once, never a copy of the model.
The directory is written beside DIR and renamed into place (pock_mlir/files.py): nothing
appears at DIR unless all of it was written. DIR must be absent, empty or an earlier export
(recognised by the `exported_by` entry in its weights' metadata), which it replaces whole.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from pock_mlir import lora
from pock_mlir.abi import StepSignature
from pock_mlir.files import TEMPORARY_PREFIX, OutputError, fsync_directory, staging_directory
from pock_mlir.quantize import dequantized

CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
HF_FILES = (CONFIG, GENERATION_CONFIG)  # the Hugging Face files a bundle and a program carry
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
EXPORTED_BY = "pock-mlir"  # every weights file's and the index's metadata: an export to replace
MODES = ("merge", "peft")
DEFAULT_MAX_SHARD_SIZE = "50GB"  # save_pretrained's
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit: a larger header is not a safetensors file
SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
ITEM_BYTES = {"bfloat16": 2} | {name: np.dtype(name).itemsize for name in SAFETENSORS_DTYPES if name != "bfloat16"}
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


class ExportError(ValueError):
    """An export that cannot be written, named with the fix."""


@dataclass(frozen=True)
class Tensor:
    """One tensor of a file to write: its key, dtype and shape, and how to fetch its value."""

    key: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    value: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return ITEM_BYTES[self.dtype] * math.prod(self.shape)


def shard_bytes(size) -> int:
    """max_shard_size as bytes: an integer, or a string as save_pretrained takes it ("5GB", "200MB", "2GiB")."""
    if isinstance(size, int) and not isinstance(size, bool):
        number, unit = size, ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", str(size), re.I)
        if not match:
            raise ExportError(f"max_shard_size {size!r}: give bytes, or a size such as '5GB' or '500MB'")
        number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if number <= 0:
        raise ExportError(f"max_shard_size must be positive, got {size!r}")
    return int(number * UNITS[unit])


def saved_keys(state_dict: dict[str, str]) -> set[str]:
    """The keys of the state_dict (key: source) that save_pretrained writes: a tied weight once,
    under the key that names its parameter (its first name: model.embed_tokens.weight, not the
    lm_head.weight tied to it, as save_pretrained drops a model's _tied_weights_keys), else under
    its first key; from_pretrained ties the others to it again."""
    kept: dict[str, str] = {}
    for key, source in state_dict.items():
        if source not in kept or key == source:
            kept[source] = key
    return set(kept.values())


def model_tensors(signature: StepSignature, fetch: Callable[[str], np.ndarray], merge: bool) -> list[Tensor]:
    """The PyTorch model's state_dict (signature.state_dict: its keys, in its order), each tensor
    fetched from the parameters and buffers by name when written: int8 weights dequantized, and with
    merge the LoRA adapters merged into their weights (lora.model_state, one weight at a time)."""
    specs = {s.name: s for s in signature.params + signature.buffers}
    quantized = {w.weight: w for w in signature.quantized}
    adapters = {a.weight: a for a in signature.adapters} if merge else {}

    def value(source: str) -> np.ndarray:
        q, a = quantized.get(source), adapters.get(source)
        stored = [q.values, q.scale] if q else [source]
        held = {name: fetch(name) for name in stored + ([a.a, a.b] if a else [])}
        return lora.merged(dequantized(held, [q] if q else []), [a] if a else [])[source]

    def spec(source: str) -> tuple[str, tuple[int, ...]]:
        if source in quantized:
            return "float32", tuple(quantized[source].weight_shape)
        return specs[source].dtype, tuple(specs[source].shape)

    return [Tensor(key, *spec(source), partial(value, source)) for key, source in signature.state_dict.items()]


class ModelParams(Mapping):
    """The model's parameters by name (int8 weights dequantized, under their weights' names),
    fetched one at a time when looked up: what lora.peft_adapter reads, without a host copy of all."""

    def __init__(self, signature: StepSignature, fetch: Callable[[str], np.ndarray]):
        self._signature, self._fetch = signature, fetch
        stored = {name for w in signature.quantized for name in (w.values, w.scale)}
        self._names = [p.name for p in signature.params if p.name not in stored]
        self._names += [w.weight for w in signature.quantized]
        self._quantized = {w.weight: w for w in signature.quantized}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._quantized:
            w = self._quantized[name]
            return w.dequantize(self._fetch(w.values), self._fetch(w.scale))
        if name not in self._names:
            raise KeyError(name)
        return self._fetch(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def shards(tensors: list[Tensor], limit: int) -> list[list[Tensor]]:
    """The tensors in order, cut as save_pretrained cuts them: a file is closed before the tensor
    that would take it over `limit` bytes (a tensor larger than `limit` has a file of its own)."""
    cut: list[list[Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if cut[-1] and size + tensor.nbytes > limit:
            cut.append([])
            size = 0
        cut[-1].append(tensor)
        size += tensor.nbytes
    return cut


def safetensors_header(tensors: list[Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors file's first bytes, for `tensors` laid out in order after it: the header's
    length, then its JSON (offsets from the shapes), padded so that the data starts 8-byte aligned
    as safetensors writes it."""
    header, offset = {}, 0
    for t in tensors:
        header[t.key] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    encoded = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded


def write_safetensors(file, tensors: list[Tensor], metadata: dict[str, str]) -> None:
    """Write a safetensors file into the binary `file` tensor by tensor: the header, then each
    value as it is fetched, checked against its declared shape and size."""
    file.write(safetensors_header(tensors, metadata))
    for t in tensors:
        value = np.require(t.value(), requirements="C")
        if tuple(value.shape) != t.shape or value.nbytes != t.nbytes:
            raise ExportError(f"{t.key}: the device holds shape {value.shape}, the signature says {t.shape}")
        file.write(memoryview(value).cast("B"))
        del value


def _write_file(path: Path, write) -> None:
    """A new file in the staged directory, written by write(file) and fsynced."""
    with open(path, "xb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, content: dict) -> None:
    _write_file(path, lambda f: f.write((json.dumps(content, indent=2) + "\n").encode()))


def _header_metadata(path: Path) -> dict:
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 0 < length <= MAX_HEADER_BYTES:
            return {}
        return json.loads(f.read(length)).get("__metadata__") or {}


def is_export(directory: Path) -> bool:
    """Whether `directory` provably holds an export of pock-mlir's: its weights say so."""
    try:
        if (directory / INDEX).is_file():
            metadata = json.loads((directory / INDEX).read_text()).get("metadata") or {}
        else:
            metadata = _header_metadata(directory / WEIGHTS)
    except (OSError, ValueError, AttributeError, RecursionError):
        return False
    return isinstance(metadata, dict) and metadata.get("exported_by") == EXPORTED_BY


def check_export_directory(directory) -> Path:
    """Refuse, before any work, a directory an export cannot be written to: a link, a file, a
    non-empty directory that is not an earlier export, an unwritable parent."""
    destination = Path(directory)
    if destination.is_symlink():
        raise OutputError(f"cannot export to {destination}: it is a symbolic link; give the directory itself")
    if destination.exists() and not destination.is_dir():
        raise OutputError(f"cannot export to {destination}: it exists and is not a directory; give a directory")
    if destination.is_dir() and any(destination.iterdir()) and not is_export(destination):
        raise OutputError(
            f"cannot export to {destination}: it holds files and is not an earlier export of pock-mlir "
            f"(which it would replace); give a new or empty directory"
        )
    parent = destination.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot export to {destination}: directory {parent} is not writable")
    return destination


def _put_in_place(staged: Path, destination: Path) -> None:
    """Move the written export to `destination`, replacing an earlier export there whole."""
    if destination.exists():
        retired = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{destination.name}.old.", dir=destination.parent))
        os.replace(destination, retired / destination.name)
        os.replace(staged, destination)
        shutil.rmtree(retired)
    else:
        os.replace(staged, destination)
    fsync_directory(destination.parent)


def config_files(files: dict[str, dict], tensors: list[Tensor]) -> dict[str, dict]:
    """The Hugging Face files to write: config.json's dtype set to that of the floating-point
    weights written (from_pretrained's dtype="auto" loads them so, not in the dtype the model was
    first published in)."""
    written = {name: dict(content) for name, content in files.items()}
    floats = {t.dtype for t in tensors if t.dtype.startswith(("float", "bfloat"))}
    if len(floats) == 1:
        written[CONFIG]["dtype"] = floats.pop()
    return written


def check_export(directory, signature: StepSignature, files: dict[str, dict], mode: str, max_shard_size):
    """(destination, shard limit in bytes) of an export, or ExportError, LoraError or OutputError
    saying why it cannot be written: what export_pretrained and pock-train check before any work."""
    if mode not in MODES:
        raise ExportError(f"lora={mode!r}: give 'merge' (adapters merged into their weights) or 'peft'")
    if CONFIG not in files:
        raise ExportError(
            "the model was compiled without a Hugging Face config (not a transformers model), so there "
            "is no config.json to export (or its bundle predates hf/: recompile it); export its state_dict instead"
        )
    if mode == "peft":
        lora.check_exportable([p.name for p in signature.params], signature.adapters, signature.trainable)
    return check_export_directory(directory), shard_bytes(max_shard_size)


def export_pretrained(
    directory,
    signature: StepSignature,
    fetch: Callable[[str], np.ndarray],
    files: dict[str, dict],
    *,
    mode: str = "merge",
    max_shard_size=DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the model of `signature` as a Hugging Face directory (see the module docstring), its
    parameters and buffers fetched by name one at a time, `files` its config.json and
    generation_config.json. Everything is checked (check_export) before anything is written."""
    destination, limit = check_export(directory, signature, files, mode, max_shard_size)
    written = saved_keys(signature.state_dict)
    tensors = [t for t in model_tensors(signature, fetch, merge=mode == "merge") if t.key in written]
    cut = shards(tensors, limit)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staged = staging_directory(destination)
    try:
        metadata = {"format": "pt", "exported_by": EXPORTED_BY}
        names = (
            [WEIGHTS]
            if len(cut) == 1
            else [f"model-{i + 1:05d}-of-{len(cut):05d}.safetensors" for i in range(len(cut))]
        )
        for name, shard in zip(names, cut):
            _write_file(staged / name, partial(write_safetensors, tensors=shard, metadata=metadata))
        if len(cut) > 1:
            index = {
                "metadata": {"total_size": sum(t.nbytes for t in tensors), "exported_by": EXPORTED_BY},
                "weight_map": {t.key: name for name, shard in zip(names, cut) for t in shard},
            }
            _write_json(staged / INDEX, index)
        for name, content in config_files(files, tensors).items():
            _write_json(staged / name, content)
        if mode == "peft":
            adapter, config = lora.peft_adapter(ModelParams(signature, fetch), signature.adapters, signature.trainable)
            _write_file(staged / ADAPTER_WEIGHTS, lambda f: f.write(save(adapter, metadata={"format": "pt"})))
            _write_json(staged / ADAPTER_CONFIG, config)
        _put_in_place(staged, destination)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return destination
