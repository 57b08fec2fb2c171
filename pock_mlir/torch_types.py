"""Reading and writing torch-dialect value types (`!torch.vtensor<[2,3],f32>`) as shapes and dtypes.

Torch-free: pock-opt parses, verifies and runs the passes that build no ops without importing
PyTorch (its start-up would otherwise be mostly that import). `TensorType.dtype` imports it.
"""

import re
from dataclasses import dataclass
from typing import NamedTuple

_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],([a-z0-9]+)>$")


class _Element(NamedTuple):
    torch_name: str  # torch.<name>
    itemsize: int  # bytes
    is_float: bool
    scalar_type: int  # c10::ScalarType code, as torch-dialect dtype operands spell it


_ELEMENTS = {
    "f32": _Element("float32", 4, True, 6),
    "f64": _Element("float64", 8, True, 7),
    "f16": _Element("float16", 2, True, 5),
    "bf16": _Element("bfloat16", 2, True, 15),
    "si64": _Element("int64", 8, False, 4),
    "si32": _Element("int32", 4, False, 3),
    "si16": _Element("int16", 2, False, 2),
    "si8": _Element("int8", 1, False, 1),
    "ui8": _Element("uint8", 1, False, 0),
    "i1": _Element("bool", 1, False, 11),
}
_ELEMENT_OF = {f"torch.{e.torch_name}": element for element, e in _ELEMENTS.items()}  # by str(torch.dtype)


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

        return getattr(torch, _ELEMENTS[self.element].torch_name)

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
        return _ELEMENTS[self.element].itemsize

    @property
    def is_float(self) -> bool:
        return _ELEMENTS[self.element].is_float

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


def scalar_type_code(dtype) -> int | None:
    """The c10::ScalarType code of a torch.dtype (a torch-dialect dtype operand), None for any other value."""
    element = _ELEMENT_OF.get(str(dtype))
    return None if element is None else _ELEMENTS[element].scalar_type
