"""Per-target implementation choices: the forms a convolution can take, and the measured table.

Each form is written once against an op namespace `ops` that is either `torch.ops` (to run or
export it: bench/iree_study.py times every form under IREE) or a `TorchBuilder` (to emit it as
torch-dialect IR: pock-backend-switch), so the form measured is the form emitted.

`<target>.json` beside this file holds the measurements (`python -m bench.iree_study convs` and
`flags`); `choose_conv_form` picks the fastest measured form for the nearest measured shape, and
`choose_data_tiling` whether IREE data-tiles a program's matmuls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TUNING_DIR = Path(__file__).resolve().parent
CONV_OPS = ("forward", "weight_grad", "input_grad")


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution with square kernel, stride and padding, dilation 1."""

    n: int
    c: int
    h: int
    w: int
    o: int
    k: int
    stride: int
    pad: int
    groups: int

    def output_size(self) -> tuple[int, int]:
        return ((self.h + 2 * self.pad - self.k) // self.stride + 1, (self.w + 2 * self.pad - self.k) // self.stride + 1)

    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.o) + self.output_size()

    @property
    def depthwise(self) -> bool:
        return self.groups == self.c == self.o and self.groups > 1

    def kind(self) -> str:
        family = "depthwise" if self.depthwise else "grouped" if self.groups > 1 else "dense"
        return (f"{family} {self.k}x{self.k}/s{self.stride} {self.c}->{self.o} {self.h}x{self.w} n{self.n}")

    def macs(self) -> int:
        ho, wo = self.output_size()
        return self.n * self.o * ho * wo * (self.c // self.groups) * self.k * self.k

    def forms(self, op: str) -> tuple[str, ...]:
        """The forms implemented for this shape and op; 'direct' is what torch and IREE do by default."""
        if self.groups == 1:
            return ("direct", "im2col")
        if self.depthwise and op != "input_grad":
            return ("direct", "patches")
        return ("direct",)

    @property
    def pointwise(self) -> bool:
        return self.k == 1 and self.stride == 1 and self.pad == 0


# -- the forms, against torch.ops or a TorchBuilder --------------------------------------

def patches(ops, x, s: ConvShape):
    """x (N, C, H, W) -> (N, C, k*k, Ho, Wo): every kernel tap's strided window (im2col)."""
    if s.pointwise:
        return ops.aten.unsqueeze(x, 2)
    ho, wo = s.output_size()
    padded = ops.aten.constant_pad_nd(x, [s.pad] * 4, 0.0) if s.pad else x
    taps = []
    for i in range(s.k):
        rows = ops.aten.slice.Tensor(padded, 2, i, i + (ho - 1) * s.stride + 1, s.stride)
        for j in range(s.k):
            taps.append(ops.aten.slice.Tensor(rows, 3, j, j + (wo - 1) * s.stride + 1, s.stride))
    return ops.aten.stack(taps, 2)


def conv_forward_im2col(ops, x, w, s: ConvShape):
    """y = W (O, C*k*k) @ cols (C*k*k, N*Ho*Wo), back to (N, O, Ho, Wo)."""
    ho, wo = s.output_size()
    cols = ops.aten.reshape(ops.aten.permute(patches(ops, x, s), [1, 2, 0, 3, 4]), [s.c * s.k * s.k, s.n * ho * wo])
    y = ops.aten.mm(ops.aten.reshape(w, [s.o, s.c * s.k * s.k]), cols)
    return ops.aten.permute(ops.aten.reshape(y, [s.o, s.n, ho, wo]), [1, 0, 2, 3])


def conv_weight_grad_im2col(ops, g, x, s: ConvShape):
    """dW = G (O, N*Ho*Wo) @ cols^T (N*Ho*Wo, C*k*k): one matmul instead of a batch-grouped conv."""
    ho, wo = s.output_size()
    g2 = ops.aten.reshape(ops.aten.permute(g, [1, 0, 2, 3]), [s.o, s.n * ho * wo])
    cols_t = ops.aten.reshape(ops.aten.permute(patches(ops, x, s), [0, 3, 4, 1, 2]), [s.n * ho * wo, s.c * s.k * s.k])
    return ops.aten.reshape(ops.aten.mm(g2, cols_t), [s.o, s.c, s.k, s.k])


def tap_windows(ops, x, s: ConvShape):
    """x (N, C, H, W) -> [(i, j, window (N, C, Ho, Wo))] for every kernel tap: unit-stride slices of
    the padded input. With stride s the padded rows and columns are first split into s phases
    ((N, C, s, s, H/s, W/s)), so a strided window is a contiguous slice of one phase: IREE
    vectorizes those, while strided slices of the innermost dim ran 2-3x slower."""
    ho, wo = s.output_size()
    hb, wb = -(-(s.k + s.stride * (ho - 1)) // s.stride), -(-(s.k + s.stride * (wo - 1)) // s.stride)
    pad = [s.pad, wb * s.stride - s.w - s.pad, s.pad, hb * s.stride - s.h - s.pad]
    padded = ops.aten.constant_pad_nd(x, pad, 0.0) if any(pad) else x
    if s.stride > 1:
        split = ops.aten.reshape(padded, [s.n, s.c, hb, s.stride, wb, s.stride])
        padded = ops.aten.permute(split, [0, 1, 3, 5, 2, 4])
    windows = []
    for i in range(s.k):
        for j in range(s.k):
            (bi, a), (bj, e) = divmod(i, s.stride), divmod(j, s.stride)
            phase = padded if s.stride == 1 else ops.aten.select.int(ops.aten.select.int(padded, 2, a), 2, e)
            rows = ops.aten.slice.Tensor(phase, 2, bi, bi + ho, 1)
            windows.append((i, j, ops.aten.slice.Tensor(rows, 3, bj, bj + wo, 1)))
    return windows


def conv_forward_patches(ops, x, w, s: ConvShape):
    """Depthwise y = sum over taps of window * w[c, tap], accumulated tap by tap (one fused
    elementwise dispatch; stacking the k*k windows and reducing them ran 3x slower)."""
    total = None
    for i, j, window in tap_windows(ops, x, s):
        tap = ops.aten.reshape(ops.aten.select.int(ops.aten.select.int(w, 2, i), 2, j), [1, s.c, 1, 1])
        term = ops.aten.mul.Tensor(window, tap)
        total = term if total is None else _add(ops, total, term)
    return total


def conv_weight_grad_patches(ops, g, x, s: ConvShape):
    """Depthwise dW[c, tap] = sum over n, h, w of g * window: a fused multiply-reduce."""
    product = ops.aten.mul.Tensor(patches(ops, x, s), ops.aten.unsqueeze(g, 2))
    return ops.aten.reshape(_sum(ops, product, [0, 3, 4]), [s.o, 1, s.k, s.k])


# torch takes sum's dtype and add's alpha as keywords, the torch dialect as operands.
def _sum(ops, x, dims):
    return ops.sum(x, dims) if _is_builder(ops) else ops.aten.sum.dim_IntList(x, dims, False)


def _add(ops, x, y):
    return ops.add(x, y) if _is_builder(ops) else ops.aten.add.Tensor(x, y)


def _is_builder(ops) -> bool:
    from pock_mlir.torch_builder import TorchBuilder

    return isinstance(ops, TorchBuilder)


def conv_input_grad_im2col(ops, g, w, s: ConvShape):
    """dcols = W^T (C*k*k, O) @ G (O, N*Ho*Wo), then col2im: each tap's window is spread back to
    its strided positions (zeros between, for stride > 1) and the k*k windows summed."""
    ho, wo = s.output_size()
    g2 = ops.aten.reshape(ops.aten.permute(g, [1, 0, 2, 3]), [s.o, s.n * ho * wo])
    w_t = ops.aten.permute(ops.aten.reshape(w, [s.o, s.c * s.k * s.k]), [1, 0])
    dcols = ops.aten.reshape(ops.aten.mm(w_t, g2), [s.c, s.k * s.k, s.n, ho, wo])
    if s.pointwise:
        return ops.aten.permute(ops.aten.reshape(dcols, [s.c, s.n, ho, wo]), [1, 0, 2, 3])
    hp, wp = s.h + 2 * s.pad, s.w + 2 * s.pad
    total = None
    for tap in range(s.k * s.k):
        i, j = divmod(tap, s.k)
        window = ops.aten.permute(ops.aten.select.int(dcols, 1, tap), [1, 0, 2, 3])  # (N, C, Ho, Wo)
        if s.stride > 1:  # (N, C, Ho, 1, Wo, 1) padded to (N, C, Ho, s, Wo, s): zeros between rows and columns
            spread = ops.aten.constant_pad_nd(ops.aten.reshape(window, [s.n, s.c, ho, 1, wo, 1]),
                                              [0, s.stride - 1, 0, 0, 0, s.stride - 1], 0.0)
            window = ops.aten.reshape(spread, [s.n, s.c, ho * s.stride, wo * s.stride])
        # place the window at row i, column j of the padded input; crop what falls past its end
        rows, cols = min(ho * s.stride, hp - i), min(wo * s.stride, wp - j)
        window = ops.aten.slice.Tensor(ops.aten.slice.Tensor(window, 2, 0, rows, 1), 3, 0, cols, 1)
        placed = ops.aten.constant_pad_nd(window, [j, wp - j - cols, i, hp - i - rows], 0.0)
        total = placed if total is None else _add(ops, total, placed)
    return ops.aten.slice.Tensor(ops.aten.slice.Tensor(total, 2, s.pad, s.pad + s.h, 1), 3, s.pad, s.pad + s.w, 1)


def conv_forms_torch(s: ConvShape) -> dict:
    """{(op, form): function of torch tensors} for every form of `s` (forward takes x, w; the
    gradients take g, x, w)."""
    import torch

    ops = torch.ops
    stride, pad = [s.stride] * 2, [s.pad] * 2

    def backward(mask, index):
        return lambda g, x, w: ops.aten.convolution_backward(g, x, w, None, stride, pad, [1, 1], False, [0, 0],
                                                             s.groups, mask)[index]

    implementations = {
        ("forward", "direct"): lambda x, w: ops.aten.convolution(x, w, None, stride, pad, [1, 1], False, [0, 0], s.groups),
        ("forward", "im2col"): lambda x, w: conv_forward_im2col(ops, x, w, s),
        ("forward", "patches"): lambda x, w: conv_forward_patches(ops, x, w, s),
        ("weight_grad", "direct"): backward([False, True, False], 1),
        ("weight_grad", "im2col"): lambda g, x, w: conv_weight_grad_im2col(ops, g, x, s),
        ("weight_grad", "patches"): lambda g, x, w: conv_weight_grad_patches(ops, g, x, s),
        ("input_grad", "direct"): backward([True, False, False], 0),
        ("input_grad", "im2col"): lambda g, x, w: conv_input_grad_im2col(ops, g, w, s),
    }
    return {(op, form): implementations[op, form] for op in CONV_OPS for form in s.forms(op)}


# -- the measured table ----------------------------------------------------------------

@lru_cache(maxsize=None)
def load_table(target: str) -> dict:
    path = TUNING_DIR / f"{target}.json"
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass(frozen=True)
class Choice:
    form: str
    reason: str


def _distance(a: ConvShape, b: dict) -> float:
    """How unlike a measured shape is: different kernel, stride or family first, then size."""
    b = ConvShape(**b)
    structural = (a.k != b.k) + (a.stride != b.stride) + (a.depthwise != b.depthwise) + (a.pointwise != b.pointwise)
    return 10 * structural + abs(math.log(a.macs() / b.macs())) + abs(math.log((a.c * a.k * a.k) / (b.c * b.k * b.k)))


# Measured: a ResNet block's strided 1x1 downsample as a direct convolution under IREE's im2col
# flag (every CPU target's) gave evaluate outputs off by 0.15 (tests/test_models_cnn.py).
MISCOMPILED_STRIDED_POINTWISE = ("IREE 3.13 miscompiles the direct form of a strided 1x1 convolution under "
                                 "--iree-global-opt-use-im2col-for-convs (wrong values in evaluate)")


def choose_conv_form(target: str, shape: ConvShape, op: str, min_speedup: float) -> Choice:
    """The fastest form measured for the nearest measured shape with the same set of forms;
    'direct' unless another form was at least `min_speedup` times faster there. A strided 1x1
    convolution's forward is im2col whatever was measured: its direct form can be wrong."""
    forms = shape.forms(op)
    if forms == ("direct",):
        return Choice("direct", "the only form implemented for this shape")
    if op == "forward" and shape.k == 1 and shape.stride > 1:
        return Choice("im2col", MISCOMPILED_STRIDED_POINTWISE)
    cases = [c for c in load_table(target).get("convs", {}).get("cases", [])
             if ConvShape(**c["shape"]).forms(op) == forms and f"{op}/direct" in c["ms"]]
    if not cases:
        return Choice("direct", f"no measurements for target '{target}' (python -m bench.iree_study convs)")
    case = min(cases, key=lambda c: _distance(shape, c["shape"]))
    timings = {form: case["ms"][f"{op}/{form}"] for form in forms if f"{op}/{form}" in case["ms"]}
    best = min(timings, key=timings.get)
    measured = ", ".join(f"{f} {t:.3f} ms" for f, t in sorted(timings.items(), key=lambda kv: kv[1]))
    where = f"measured on {target} for {case['class']}: {measured}"
    if best != "direct" and timings["direct"] / timings[best] >= min_speedup:
        return Choice(best, where)
    return Choice("direct", where)


# -- IREE's data tiling, per program -----------------------------------------------------------

DATA_TILING_SET = "im2col+global-data-tiling"  # the flag set of `python -m bench.iree_study flags`
BASELINE_SET = "im2col"
# Packing a matmul's operands into the CPU's tile layout costs a dispatch per operand; the MLP's
# 34-MFLOP matmuls do not win that back, the transformers' matmuls of 0.5 GFLOP and up do.
MIN_DATA_TILED_MATMUL_FLOPS = 100_000_000


def choose_data_tiling(target: str, has_convolutions: bool, largest_matmul_flops: int) -> Choice:
    """Form "data-tiled" or "plain" for a whole program, from the whole-step measurements of the
    target's flag study: data tiling for programs without convolutions whose largest matmul is
    big enough, because it measured faster there and slower on the convolutional steps."""
    steps = load_table(target).get("flags", {}).get("step_ms", {})
    ratios = {model: sets[DATA_TILING_SET]["step_ms_median"] / sets[BASELINE_SET]["step_ms_median"]
              for model, sets in steps.items()
              if "step_ms_median" in sets.get(DATA_TILING_SET, {}) and "step_ms_median" in sets.get(BASELINE_SET, {})}
    if not ratios:
        return Choice("plain", f"no data-tiling measurements for target '{target}' (python -m bench.iree_study flags)")
    measured = "step time with data tiling, measured on " + target + ": " + ", ".join(
        f"{model} {ratio:.2f}x" for model, ratio in ratios.items())
    if has_convolutions:  # backend_report() counts them per function
        return Choice("plain", f"the program has convolutions; {measured}")
    if largest_matmul_flops < MIN_DATA_TILED_MATMUL_FLOPS:
        return Choice("plain", f"largest matmul {largest_matmul_flops / 1e6:.0f} MFLOP, under "
                               f"{MIN_DATA_TILED_MATMUL_FLOPS / 1e6:.0f}; {measured}")
    return Choice("data-tiled", f"no convolutions, largest matmul {largest_matmul_flops / 1e6:.0f} MFLOP; {measured}")
