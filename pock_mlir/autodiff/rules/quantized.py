"""The int4 matmuls: `pock.int4_linear` (x @ W^T, traced from pock_mlir/layers.py's custom op) and
`pock.int4_matmul` (g @ W, its input gradient), with W held as int4 bytes and group scales
(pock_mlir/quantize.py's layout: [out, in/2] uint8, [out, in/G] float32). IREE knows neither:
pock-expand-custom expands each into float32 matmuls over chunks of W unpacked from the bytes, the
forward by rows of W and the input gradient by columns, so no more of W than a chunk is ever
float32. Each is split in two at least, so that the forward and the backward never unpack the same
chunk, which IREE's CSE would merge into one float32 copy of W living from the forward to the backward.
"""

import numpy as np

from pock_mlir.op_facts import declare, shape_of

from .base import defrule


def _unpack(b, packed, scale, group):
    """The float32 values of int4 rows: [r, c/2] bytes, [r, c/G] scales -> [r, c]. A byte's low
    nibble is the first of its two values, its high nibble the second, each less 8 and times its
    group's scale."""
    rows, half = b.shape(packed)
    byte = b.cast(packed, b.type_of(scale).dtype)  # exact: the nibbles in the scales' float32
    high = b.aten.floor(b.mul(byte, 1 / 16))
    low = b.sub(byte, b.mul(high, 16.0))
    values = b.sub(b.aten.stack([low, high], 2), 8.0)
    groups = b.shape(scale)[1]
    grouped = b.mul(b.reshape(values, (rows, groups, 2 * half // groups)), b.aten.unsqueeze(scale, 2))
    return b.reshape(grouped, (rows, 2 * half))


def _chunks(size: int, step: int):
    return [(start, min(size, start + step)) for start in range(0, size, step)]


def _rows(b, x):
    """x as a matrix of its rows (the tokens), and the shape that puts them back."""
    lead = b.shape(x)[:-1]
    return b.reshape(x, (-1, b.shape(x)[-1])), lead


def _joined(b, parts, lead):
    product = parts[0] if len(parts) == 1 else b.aten.cat(parts, 1)
    return b.reshape(product, (*lead, b.shape(product)[1]))


def expand_int4_linear(b, chunk: int, x, packed, scale, group):
    """x @ W^T as one matmul per chunk of W's rows (each at most `chunk` values, half of them at
    most), joined."""
    out, half = b.shape(packed)
    rows = max(1, min(chunk // (2 * half), -(-out // 2)))
    x2, lead = _rows(b, x)
    parts = []
    for start, stop in _chunks(out, rows):
        w = _unpack(
            b, b.aten.slice.Tensor(packed, 0, start, stop, 1), b.aten.slice.Tensor(scale, 0, start, stop, 1), group
        )
        parts.append(b.aten.mm(x2, b.transpose(w)))
    return _joined(b, parts, lead)


def expand_int4_matmul(b, chunk: int, g, packed, scale, group):
    """g @ W as one matmul per chunk of W's columns (whole groups, each at most `chunk` values
    where a group allows, half of them at most), joined."""
    out, half = b.shape(packed)
    groups = 2 * half // group
    columns = max(1, min(chunk // (out * group), -(-groups // 2))) * group
    g2, lead = _rows(b, g)
    parts = []
    for start, stop in _chunks(2 * half, columns):
        bytes_ = b.aten.slice.Tensor(packed, 1, start // 2, stop // 2, 1)
        w = _unpack(b, bytes_, b.aten.slice.Tensor(scale, 1, start // group, stop // group, 1), group)
        parts.append(b.aten.mm(g2, w))
    return _joined(b, parts, lead)


def _int4_flops(op) -> int:
    """Every output element is a dot product over W's inputs (linear) or outputs (matmul)."""
    (out, half), result = shape_of(op.operands[1]), shape_of(op.results[0])
    return 2 * int(np.prod(result)) * (2 * half if result[-1] == out else out)


@defrule("pock.int4_linear", flops=_int4_flops, expand=expand_int4_linear)
def int4_linear(b, g, out, x, packed, scale, group):
    """dx = g @ W, as pock.int4_matmul: W stays int4 (frozen: packed and scale get none)."""
    return b.operator("pock.int4_matmul", (*b.shape(g)[:-1], b.shape(x)[-1]), g, packed, scale, group), None, None, None


declare("pock.int4_matmul", flops=_int4_flops, expand=expand_int4_matmul)
