"""Training checkpoints: one safetensors file holding everything a resumed run needs.

tensors   "model/<key>"             parameters and buffers (Trainer.state_dict(): the model's
                                    state_dict keys, tied weights under each key)
          "optimizer/<param>.<slot>" the optimizer state, and "optimizer/step" (steps taken)
metadata  format, module_sha256     the bundle module the state belongs to
          tensors_sha256            over every tensor's name and bytes: detects corruption that
                                    leaves the safetensors header readable
          progress                  JSON: where in the data the run was (epoch, batch, seed, ...)

Files are replaced atomically (pock_mlir/files.py): a crash, a kill or Ctrl-C at any moment leaves
either the previous file or the new one, never a mix. Both ways the tensors stream: written one at a
time from the device (twice: first for the checksum the header holds), read as views of the file
mapped into memory, so the host never holds a copy of the model and its optimizer state beside
the device's (bench/export_memory.py measures it).
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import stat
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from pock_mlir.abi import STEP_COUNT
from pock_mlir.files import atomic_file
from pock_mlir.runtime.export import MAX_HEADER_BYTES, SAFETENSORS_DTYPES, write_safetensors

FORMAT = "pock-checkpoint-2"
# Its "model/" tensors were the parameters and buffers by name (non-persistent buffers included,
# a tied weight under its first key only): read and given the model's keys.
FORMAT_BY_NAME = "pock-checkpoint-1"


class CheckpointError(ValueError):
    pass


NUMPY_DTYPES = {code: np.dtype(name) for name, code in SAFETENSORS_DTYPES.items() if name != "bfloat16"}


def _hash_tensor(digest, name: str, value: np.ndarray) -> np.ndarray:
    value = np.require(value, requirements="C")
    digest.update(name.encode())
    digest.update(memoryview(value).cast("B"))
    return value


def _tensors_sha256(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        _hash_tensor(digest, name, tensors[name])
    return digest.hexdigest()


@dataclass
class Checkpoint:
    state_dict: dict[str, np.ndarray]  # Trainer.state_dict()
    optimizer_state: dict[str, np.ndarray]  # Trainer.optimizer_state()
    progress: dict  # what the training loop needs to continue where it stopped

    @property
    def steps(self) -> int:
        return int(self.optimizer_state["step"])


def save_checkpoint(path, trainer, progress: dict, module_sha256: str) -> None:
    tensors = [replace(t, key=f"model/{t.key}") for t in trainer.state_tensors()]
    tensors += [replace(t, key=f"optimizer/{t.key}") for t in trainer.optimizer_tensors()]
    digest = hashlib.sha256()
    for t in sorted(tensors, key=lambda t: t.key):  # the header comes first: the checksum is read apart
        _hash_tensor(digest, t.key, t.value())
    metadata = {
        "format": FORMAT,
        "module_sha256": module_sha256,
        "tensors_sha256": digest.hexdigest(),
        "progress": json.dumps(progress),
    }
    with atomic_file(path) as f:
        write_safetensors(f, tensors, metadata)


def _views(data: mmap.mmap, header: dict) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (its header already validated by safetensors), as
    read-only arrays over its mapped bytes."""
    start = 8 + int.from_bytes(data[:8], "little")
    views = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in NUMPY_DTYPES:
            raise ValueError(f"{name} has dtype {entry['dtype']}, which no checkpoint holds")
        begin, _ = entry["data_offsets"]
        dtype, count = NUMPY_DTYPES[entry["dtype"]], math.prod(entry["shape"])
        views[name] = np.frombuffer(data, dtype, count, start + begin).reshape(entry["shape"])
    return views


def load_checkpoint(path, bundle) -> Checkpoint:
    """Read a checkpoint for `bundle`; raises CheckpointError saying what is wrong with it."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise CheckpointError(f"{path} is not a regular file, so not a checkpoint")
        with open(path, "rb") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if file.seek(0, 2) else b""
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    header_length = int.from_bytes(data[:8], "little")
    if len(data) < 8 or header_length > min(MAX_HEADER_BYTES, len(data) - 8):
        raise CheckpointError(f"{path} is corrupt or not a checkpoint (its header claims {header_length} bytes)")
    try:
        with safe_open(path, framework="numpy"):  # validates the header: offsets, dtypes, sizes
            pass
        header = json.loads(data[8 : 8 + header_length])
        tensors, metadata = _views(data, header), header.get("__metadata__") or {}
        progress = json.loads(metadata.get("progress", "{}"))
    except (
        SafetensorError,
        ValueError,
        KeyError,
        TypeError,
        UnicodeDecodeError,
        RecursionError,
    ) as e:  # JSONDecodeError: a ValueError
        raise CheckpointError(f"{path} is corrupt or not a checkpoint (unreadable safetensors: {e})") from None
    if metadata.get("format") not in (FORMAT, FORMAT_BY_NAME):
        raise CheckpointError(
            f"{path} is not a pock checkpoint (format {metadata.get('format')!r}, expected {FORMAT!r})"
        )
    if metadata.get("tensors_sha256") != _tensors_sha256(tensors):
        raise CheckpointError(f"{path} is corrupt: its tensors do not match the checksum written with them")
    if metadata.get("module_sha256") != bundle.module_sha256:
        raise CheckpointError(
            f"{path} was written while training another bundle (module sha256 "
            f"{metadata.get('module_sha256', '?')[:12]}…, this bundle's is {bundle.module_sha256[:12]}…)"
        )
    sig = bundle.signature
    by_name = metadata["format"] == FORMAT_BY_NAME
    model = {s.name: s for s in sig.params + sig.buffers} if by_name else sig.keyed_specs
    expected = {f"model/{name}": s for name, s in model.items()}
    expected.update({f"optimizer/{s.name}": s for s in sig.state})
    expected["optimizer/step"] = STEP_COUNT
    differences = [f"missing {n}" for n in sorted(set(expected) - set(tensors))]
    differences += [f"unexpected {n}" for n in sorted(set(tensors) - set(expected))]
    differences += [
        f"{n}: shape {tensors[n].shape} {tensors[n].dtype}, the bundle has {tuple(s.shape)} {s.dtype}"
        for n, s in expected.items()
        if n in tensors and (tensors[n].shape != tuple(s.shape) or str(tensors[n].dtype) != s.dtype)
    ]
    if differences:
        raise CheckpointError(f"{path} does not fit this bundle: {'; '.join(differences)}")
    state_dict = {n.removeprefix("model/"): v for n, v in tensors.items() if n.startswith("model/")}
    return Checkpoint(
        state_dict=sig.keyed_state(state_dict) if by_name else state_dict,
        optimizer_state={n.removeprefix("optimizer/"): v for n, v in tensors.items() if n.startswith("optimizer/")},
        progress=progress,
    )
