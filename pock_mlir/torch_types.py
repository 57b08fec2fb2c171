"""Reading and writing torch-dialect value types (`!torch.vtensor<[2,3],f32>`) as shapes and dtypes."""

import re
from dataclasses import dataclass

import torch

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],([a-z0-9]+)>$")

_DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "si64": torch.int64,
    "si32": torch.int32,
    "si16": torch.int16,
    "si8": torch.int8,
    "ui8": torch.uint8,
    "i1": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    def asm(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"!torch.vtensor<[{dims}],{_DTYPE_NAMES[self.dtype]}>"


def parse_tensor_type(type_) -> TensorType | None:
    """The shape and dtype of a `!torch.vtensor` type, or None for any other type."""
    m = _VTENSOR.match(str(type_))
    if not m or m.group(2) not in _DTYPES:
        return None
    dims = m.group(1)
    if "?" in dims:
        raise ValueError(f"dynamic shapes are not supported: {type_}; export with static example inputs")
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    return TensorType(shape, _DTYPES[m.group(2)])


def tensor_type_of(value) -> TensorType | None:
    return parse_tensor_type(value.type)
