"""int8 and int4 frozen bases: frozen weights stored as int8 with a float32 scale per output
channel, or as int4 with one per group of input values.

`quantize: {frozen: int8}` in a sparse config stores the weight of every nn.Linear, Hugging Face
Conv1D and nn.Conv2d that the scheme freezes (LoRA's base weights included) as symmetric int8,

    scale[c] = max |W[c]| / 127   (1 for an all-zero channel),   q = round(W / scale) in [-127, 127]

as two frozen parameters, `<module>.weight_int8` and `<module>.weight_scale`, in the module, the
bundle and on the device. The traced forward computes with `q` cast to float32 and applies the
scale to the layer's output, y = (x @ q^T) * scale + b, so the cast is an elementwise producer IREE
fuses into the matmul or convolution (and into the input gradient's; programs holding int8 weights
compile with iree_flags.FUSE_MATMUL_PRODUCERS for it), instead of a float32 copy of the weight.
Under int8 a weight shared by several modules (tied embeddings) stays float32.

`quantize: {frozen: int4}` stores them group-wise in 4 bits, two values a byte: along the input
dimension, in groups of G values (32; `int4:group=64` chooses G, which must divide it),

    scale[o, g] = max |W[o, group g]| / 7   (1 for an all-zero group),   q = round(W / scale) in [-7, 7]

(symmetric: -8 is never used, so 0 stays exact and the range mirrors), as `<module>.weight_int4`,
uint8 [out, in/2] holding q + 8 of input column 2j in the low nibble of byte j and of 2j + 1 in
its high nibble, and `<module>.weight_scale`, float32 [out, in/G]. A Conv1D's [in, out] weight is
stored transposed, so every int4 weight is [out, in]. Besides linears and Conv1Ds, int4 stores
embeddings (a lookup gathers packed rows and their scales, then unpacks them) and a weight tied
between an embedding and a linear head (one packed tensor, read by both); convolutions stay float32
under it. The traced forward unpacks with bitwise ops, scales each group and feeds the matmul, so
the unpacking is a producer IREE fuses into the matmuls of the forward and of the input gradient.

The exported state_dict holds the dequantized weights (q * scale): the model as it trained.
This module needs neither PyTorch nor torch-mlir; which weights of a PyTorch model int8 and int4
store, and the forward that traces them, are in pock_mlir/layers.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from pock_mlir.abi import KINDS, Policy

FORMATS = ("int8", "int4")  # `int4:group=N` chooses int4's group size (parse_format)
DEFAULT_GROUP = 32
# The layer kinds a quantized weight can have: abi.KINDS, and (int4 only) embeddings
QUANTIZED_KINDS = (*KINDS, "embedding")
VALUE_DTYPES = {"int8": np.int8, "int4": np.uint8}  # each format's stored values (int4: two a byte)
BLOCK_ELEMENTS = 1 << 22  # quantize's block of output channels: about 16 MB of float32 at a time
_FORMAT = re.compile(r"^(int8|int4)(?::group=(\d+))?$")


class QuantizeError(ValueError):
    pass


def parse_format(text) -> tuple[str, int]:
    """ "int8" -> ("int8", 0), "int4" -> ("int4", 32), "int4:group=64" -> ("int4", 64); a ValueError
    naming the accepted forms otherwise (a QuantizeError)."""
    m = _FORMAT.match(text) if isinstance(text, str) else None
    if not m or (m.group(1) == "int8" and m.group(2)) or (m.group(2) and int(m.group(2)) < 2):
        raise QuantizeError(
            f"quantize takes {{frozen: int8}}, {{frozen: int4}} or {{frozen: 'int4:group=N'}} (N even, >= 2), "
            f"got {text!r}"
        )
    if m.group(1) == "int8":
        return "int8", 0
    group = int(m.group(2) or DEFAULT_GROUP)
    if group % 2:
        raise QuantizeError(f"int4's group must be even (two values a byte), got group={group}")
    return "int4", group


@dataclass(frozen=True)
class QuantizedWeight:
    module: str
    kind: str  # one of QUANTIZED_KINDS
    weight_shape: tuple[int, ...]  # the weight as the module stores it
    format: str = "int8"  # one of FORMATS
    group: int = 0  # int4: the input values sharing a scale
    tied: tuple[str, ...] = ()  # int4: the linear heads that read the same weight (tied embeddings)

    @property
    def weight(self) -> str:
        return f"{self.module}.weight"

    @property
    def values(self) -> str:
        return f"{self.module}.weight_{self.format}"

    @property
    def scale(self) -> str:
        return f"{self.module}.weight_scale"

    @property
    def stored_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes of the stored values and scale."""
        if self.format == "int8":
            return self.weight_shape, (self.weight_shape[self.channel_axis],)
        out, inputs = self._rows_columns
        return (out, inputs // 2), (out, inputs // self.group)

    @property
    def stored_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """{values, scale}: each stored tensor's shape and dtype, as quantize returns them."""
        values, scale = self.stored_shapes
        return {self.values: (values, np.dtype(VALUE_DTYPES[self.format])), self.scale: (scale, np.dtype(np.float32))}

    @property
    def saved_bytes(self) -> int:
        """What storing it as its values and float32 scales saves over float32."""
        values, scale = self.stored_shapes
        itemsize = 1  # int8, or two int4 values a byte
        return 4 * math.prod(self.weight_shape) - itemsize * math.prod(values) - 4 * math.prod(scale)

    @property
    def channel_axis(self) -> int:
        """The output-channel axis of the stored weight (Conv1D stores [in, out])."""
        return 1 if self.kind == "conv1d" else 0

    @property
    def _rows_columns(self) -> tuple[int, int]:
        """int4's [out, in] (a Conv1D's weight transposed)."""
        rows, columns = self.weight_shape
        return (columns, rows) if self.kind == "conv1d" else (rows, columns)

    def quantize(self, weight: np.ndarray) -> dict[str, np.ndarray]:
        """{values, scale} for a float32 weight: int8 with a scale per output channel, or int4
        packed two a byte with a scale per group of input values. A block of output channels at a
        time, so that its temporaries stay small next to the weight (a 1B model's embedding)."""
        if self.format == "int4":
            return self._quantize_int4(weight)
        channels = np.moveaxis(weight, self.channel_axis, 0)  # views, [out, ...]
        values = np.empty(weight.shape, VALUE_DTYPES["int8"])
        scale = np.empty(channels.shape[0], np.float32)
        for rows in _blocks(channels.shape[0], channels[0].size):
            block = channels[rows]
            largest = np.abs(block).reshape(len(block), -1).max(axis=1)
            scale[rows] = np.where(largest > 0, largest / 127, 1)
            shaped = scale[rows].reshape((-1,) + (1,) * (block.ndim - 1))
            np.moveaxis(values, self.channel_axis, 0)[rows] = np.clip(np.rint(block / shaped), -127, 127)
        return {self.values: values, self.scale: scale}

    def dequantize(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        if self.format == "int4":
            return self._dequantize_int4(values, scale)
        return (values.astype(np.float32) * self._broadcast(scale, values.ndim)).astype(np.float32)

    def _quantize_int4(self, weight: np.ndarray) -> dict[str, np.ndarray]:
        out, inputs = self._rows_columns
        rows_in = weight.T if self.kind == "conv1d" else weight  # a view, [out, in]
        packed = np.empty((out, inputs // 2), VALUE_DTYPES["int4"])
        scale = np.empty((out, inputs // self.group), np.float32)
        for rows in _blocks(out, inputs):
            grouped = rows_in[rows].reshape(-1, inputs // self.group, self.group)
            largest = np.abs(grouped).max(axis=2)
            scale[rows] = np.where(largest > 0, largest / 7, 1)
            q = np.clip(np.rint(grouped / scale[rows][:, :, None]), -7, 7).astype(np.int16) + 8  # 1..15, a nibble
            pairs = q.reshape(-1, inputs // 2, 2)
            packed[rows] = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
        return {self.values: packed, self.scale: scale}

    def _dequantize_int4(self, packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
        out, inputs = self._rows_columns
        q = np.stack([packed & 15, packed >> 4], axis=2).astype(np.float32) - 8
        weight = (q.reshape(out, -1, self.group) * scale[:, :, None]).reshape(out, inputs).astype(np.float32)
        return weight.T.copy() if self.kind == "conv1d" else weight

    def _broadcast(self, scale: np.ndarray, ndim: int) -> np.ndarray:
        shape = [1] * ndim
        shape[self.channel_axis] = -1
        return scale.reshape(shape)

    def to_json(self) -> dict:
        return {**asdict(self), "weight_shape": list(self.weight_shape), "tied": list(self.tied)}

    @staticmethod
    def from_json(entry: dict) -> QuantizedWeight:
        if entry.get("kind") not in QUANTIZED_KINDS:
            raise ValueError(
                f"quantized weight {entry.get('module')!r}: kind must be one of {', '.join(QUANTIZED_KINDS)}"
            )
        fmt = entry.get("format")
        if fmt not in FORMATS:
            raise ValueError(f"quantized weight {entry.get('module')!r}: format must be one of {', '.join(FORMATS)}")
        return QuantizedWeight(
            str(entry["module"]),
            entry["kind"],
            tuple(int(d) for d in entry["weight_shape"]),
            fmt,
            int(entry["group"]),
            tuple(str(m) for m in entry["tied"]),
        )


def _blocks(channels: int, per_channel: int):
    """Slices of `channels` output channels of `per_channel` values each, BLOCK_ELEMENTS at a time."""
    step = max(1, BLOCK_ELEMENTS // max(per_channel, 1))
    for start in range(0, channels, step):
        yield slice(start, min(start + step, channels))


def stored_policies(policies: dict, quantized: list[QuantizedWeight]) -> dict:
    """`policies` over the parameters as stored: each quantized weight's values and scale frozen."""
    result = {name: policy for name, policy in policies.items() if name not in {w.weight for w in quantized}}
    result.update({name: Policy("frozen") for w in quantized for name in (w.values, w.scale)})
    return result


def dequantized(state: dict[str, np.ndarray], quantized: list[QuantizedWeight]) -> dict[str, np.ndarray]:
    """`state` with each quantized weight replaced by its float32 value under the weight's own name."""
    stored = {name for w in quantized for name in (w.values, w.scale)}
    result = {name: value for name, value in state.items() if name not in stored}
    result.update({w.weight: w.dequantize(state[w.values], state[w.scale]) for w in quantized})
    return result
