"""An int8 frozen base: frozen weights stored as int8 with a float32 scale per output channel.

`quantize: {frozen: int8}` in a sparse config stores the weight of every nn.Linear, Hugging Face
Conv1D and nn.Conv2d that the scheme freezes (LoRA's base weights included) as symmetric int8,

    scale[c] = max |W[c]| / 127   (1 for an all-zero channel),   q = round(W / scale) in [-127, 127]

as two frozen parameters, `<module>.weight_int8` and `<module>.weight_scale`, in the module, the
bundle and on the device. The traced forward computes with `q` cast to float32 and applies the
scale to the layer's output, y = (x @ q^T) * scale + b, so the cast is an elementwise producer IREE
fuses into the matmul or convolution (and into the input gradient's; programs holding int8 weights
compile with iree_flags.FUSE_MATMUL_PRODUCERS for it), instead of a float32 copy of the weight. A weight shared by several modules (tied embeddings) stays float32.

The exported state_dict holds the dequantized weights (q * scale): the model as it trained.
This module needs neither PyTorch nor torch-mlir; which weights of a PyTorch model int8 stores,
and the forward that traces them, are in pock_mlir/layers.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from pock_mlir.abi import KINDS, Policy

FORMATS = ("int8",)


@dataclass(frozen=True)
class QuantizedWeight:
    module: str
    kind: str  # one of KINDS
    weight_shape: tuple[int, ...]

    @property
    def weight(self) -> str:
        return f"{self.module}.weight"

    @property
    def values(self) -> str:
        return f"{self.module}.weight_int8"

    @property
    def scale(self) -> str:
        return f"{self.module}.weight_scale"

    @property
    def saved_bytes(self) -> int:
        """What storing it as int8 values and a float32 scale per output channel saves over float32."""
        return 3 * math.prod(self.weight_shape) - 4 * self.weight_shape[self.channel_axis]

    @property
    def channel_axis(self) -> int:
        """The output-channel axis of the stored weight (Conv1D stores [in, out])."""
        return 1 if self.kind == "conv1d" else 0

    def quantize(self, weight: np.ndarray) -> dict[str, np.ndarray]:
        """{values: int8, scale: float32 per output channel} for a float32 weight."""
        reduce = tuple(i for i in range(weight.ndim) if i != self.channel_axis)
        largest = np.abs(weight).max(axis=reduce)
        scale = np.where(largest > 0, largest / 127, 1).astype(np.float32)
        q = np.clip(np.rint(weight / self._broadcast(scale, weight.ndim)), -127, 127).astype(np.int8)
        return {self.values: q, self.scale: scale}

    def dequantize(self, values: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return (values.astype(np.float32) * self._broadcast(scale, values.ndim)).astype(np.float32)

    def _broadcast(self, scale: np.ndarray, ndim: int) -> np.ndarray:
        shape = [1] * ndim
        shape[self.channel_axis] = -1
        return scale.reshape(shape)

    def to_json(self) -> dict:
        return {**asdict(self), "weight_shape": list(self.weight_shape)}

    @staticmethod
    def from_json(entry: dict) -> QuantizedWeight:
        if entry.get("kind") not in KINDS:
            raise ValueError(f"quantized weight {entry.get('module')!r}: kind must be one of {', '.join(KINDS)}")
        return QuantizedWeight(str(entry["module"]), entry["kind"], tuple(int(d) for d in entry["weight_shape"]))


def stored_policies(policies: dict, quantized: list[QuantizedWeight]) -> dict:
    """`policies` over the parameters as stored: each int8 weight's values and scale frozen."""
    result = {name: policy for name, policy in policies.items() if name not in {w.weight for w in quantized}}
    result.update({name: Policy("frozen") for w in quantized for name in (w.values, w.scale)})
    return result


def dequantized(state: dict[str, np.ndarray], quantized: list[QuantizedWeight]) -> dict[str, np.ndarray]:
    """`state` with each int8 weight replaced by its float32 value under the weight's own name."""
    stored = {name for w in quantized for name in (w.values, w.scale)}
    result = {name: value for name, value in state.items() if name not in stored}
    result.update({w.weight: w.dequantize(state[w.values], state[w.scale]) for w in quantized})
    return result
