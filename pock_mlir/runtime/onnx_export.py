"""The tuned weights back in the ONNX inference model a program was compiled from (Trainer.export_onnx).

Torch-free: the `onnx` package edits the protobuf (an optional dependency of this feature alone:
the `onnx` extra). Each initializer the trainer holds under its name gets the trained value;
the graph, its other initializers and its metadata are the source's. One file of at most 2 GB
(protobuf's limit), external data inlined.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pock_mlir.files import atomic_write, check_writable


class OnnxExportError(ValueError):
    """The source model is not the one the trainer was compiled from, or onnx is missing."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise OnnxExportError("export_onnx needs the onnx package: pip install 'pock-mlir[onnx]'") from None
    return onnx


def _source_model(onnx, source):
    if isinstance(source, (str, os.PathLike)):
        if not Path(source).is_file():
            raise OnnxExportError(f"{source}: no such ONNX file; give the .onnx model the program was compiled from")
        return onnx.load(source)
    if type(source).__name__ != "ModelProto":
        raise OnnxExportError(f"source must be an .onnx path or an onnx.ModelProto, got {type(source).__name__}")
    copy = onnx.ModelProto()
    copy.CopyFrom(source)
    return copy


def write_onnx(path, source, state: dict[str, np.ndarray]) -> Path:
    """Write `source` (an .onnx path or ModelProto) to `path` with each initializer named in
    `state` replaced by its value there; every entry of `state` must name an initializer of the
    same shape (checked before writing)."""
    onnx = _onnx()
    from onnx import numpy_helper

    path = check_writable(Path(path))
    model = _source_model(onnx, source)
    initializers = {i.name: i for i in model.graph.initializer}
    missing = sorted(set(state) - set(initializers))
    if missing:
        raise OnnxExportError(
            f"the source model has no initializer {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}: "
            f"give the .onnx model the program was compiled from"
        )
    for name, value in state.items():
        shape = tuple(initializers[name].dims)
        if shape != value.shape:
            raise OnnxExportError(
                f"initializer {name!r} has shape {shape} in the source model, the trainer holds {value.shape}: "
                f"give the .onnx model the program was compiled from"
            )
    for name, value in state.items():
        initializers[name].CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32), name))
    atomic_write(path, model.SerializeToString())
    return path
