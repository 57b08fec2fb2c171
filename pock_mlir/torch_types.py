"""Reading and writing torch-dialect value types (`!torch.vtensor<[2,3],f32>`) as shapes and dtypes.

Torch-free: pock-opt parses, verifies and runs the passes that build no ops without importing
PyTorch (its start-up would otherwise be mostly that import). `TensorType.dtype` imports it.
"""

import re
from dataclasses import dataclass

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],([a-z0-9]+)>$")

# element type -> (torch dtype name, bytes per element, floating point)
_ELEMENTS = {
    "f32": ("float32", 4, True),
    "f64": ("float64", 8, True),
    "f16": ("float16", 2, True),
    "bf16": ("bfloat16", 2, True),
    "si64": ("int64", 8, False),
    "si32": ("int32", 4, False),
    "si16": ("int16", 2, False),
    "si8": ("int8", 1, False),
    "ui8": ("uint8", 1, False),
    "i1": ("bool", 1, False),
}
_ELEMENT_OF = {f"torch.{name}": element for element, (name, _, _) in _ELEMENTS.items()}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    element: str  # the torch dialect's element type: "f32", "si64", "i1", ...

    @classmethod
    def of(cls, shape, dtype) -> "TensorType":
        """The type of a tensor of `shape` and the torch.dtype `dtype`."""
        return cls(tuple(shape), _ELEMENT_OF[str(dtype)])

    @property
    def dtype(self):
        """The torch.dtype (imports PyTorch)."""
        import torch

        return getattr(torch, _ELEMENTS[self.element][0])

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
    def itemsize(self) -> int:
        return _ELEMENTS[self.element][1]

    @property
    def is_float(self) -> bool:
        return _ELEMENTS[self.element][2]

    def asm(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"!torch.vtensor<[{dims}],{self.element}>"


def parse_tensor_type(type_) -> TensorType | None:
    """The shape and dtype of a `!torch.vtensor` type, or None for any other type."""
    m = _VTENSOR.match(str(type_))
    if not m or m.group(2) not in _ELEMENTS:
        return None
    dims = m.group(1)
    if "?" in dims:
        raise ValueError(f"dynamic shapes are not supported: {type_}; export with static example inputs")
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    return TensorType(shape, m.group(2))


def tensor_type_of(value) -> TensorType | None:
    return parse_tensor_type(value.type)
