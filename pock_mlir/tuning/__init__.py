"""Per-target implementation choices from measurements.

`<target>.json` beside this file holds the measurements (`python -m bench.iree_study convs` and
`flags`); `choose_conv_form` picks the fastest measured form (pock_mlir/conv_forms.py) for the
nearest measured shape, and `choose_data_tiling` whether IREE data-tiles a program's matmuls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pock_mlir.conv_forms import ConvShape

TUNING_DIR = Path(__file__).resolve().parent


# -- the measured table ----------------------------------------------------------------

@lru_cache(maxsize=None)
def load_table(target: str) -> dict:
    path = TUNING_DIR / f"{target}.json"
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass(frozen=True)
class Choice:
    form: str
    reason: str


def _distance(a: ConvShape, b: ConvShape) -> float:
    """How unlike a measured shape is: different kernel, stride, dilation or family first, then size."""
    wa, wb = a.window, b.window
    structural = ((wa.kernel != wb.kernel) + (wa.stride != wb.stride) + (wa.dilation != wb.dilation)
                  + (a.depthwise != b.depthwise) + (a.pointwise != b.pointwise))
    taps = a.c * math.prod(wa.kernel) / (b.c * math.prod(wb.kernel))
    return 10 * structural + abs(math.log(a.macs() / b.macs())) + abs(math.log(taps))


# Measured: a ResNet block's strided 1x1 downsample as a direct convolution under IREE's im2col
# flag (every CPU target's) gave evaluate outputs off by 0.15 (tests/test_models_cnn.py).
MISCOMPILED_STRIDED_POINTWISE = ("IREE 3.13 miscompiles the direct form of a strided 1x1 convolution under "
                                 "--iree-global-opt-use-im2col-for-convs (wrong values in evaluate)")


def choose_conv_form(target: str, shape: ConvShape, op: str, min_speedup: float) -> Choice:
    """The fastest form measured for the nearest measured shape with the same set of forms; the
    op's baseline form (the first of shape.forms) unless another was at least `min_speedup`
    times faster there. A strided 1x1 convolution's forward is im2col whatever was measured:
    its direct form can be wrong."""
    forms = shape.forms(op)
    baseline = forms[0]
    if len(forms) == 1:
        return Choice(baseline, "the only form implemented for this shape")
    if op == "forward" and shape.window.kernel == (1, 1) and max(shape.window.stride) > 1:
        return Choice("im2col", MISCOMPILED_STRIDED_POINTWISE)
    cases = [(ConvShape.from_json(c["shape"]), c) for c in load_table(target).get("convs", {}).get("cases", [])]
    cases = [(s, c) for s, c in cases if s.forms(op) == forms and f"{op}/{baseline}" in c["ms"]]
    if not cases:
        return Choice(baseline, f"no measurements for target '{target}' (python -m bench.iree_study convs)")
    _, case = min(cases, key=lambda sc: _distance(shape, sc[0]))
    timings = {form: case["ms"][f"{op}/{form}"] for form in forms if f"{op}/{form}" in case["ms"]}
    best = min(timings, key=timings.get)
    measured = ", ".join(f"{f} {t:.3f} ms" for f, t in sorted(timings.items(), key=lambda kv: kv[1]))
    where = f"measured on {target} for {case['class']}: {measured}"
    if best != baseline and timings[baseline] / timings[best] >= min_speedup:
        return Choice(best, where)
    return Choice(baseline, where)


# -- IREE's data tiling, per program -----------------------------------------------------------

DATA_TILING_SET = "im2col+global-data-tiling"  # the flag set of `python -m bench.iree_study flags`
BASELINE_SET = "im2col"
# Packing a matmul's operands into the CPU's tile layout costs a dispatch per operand; the MLP's
# 34-MFLOP matmuls do not win that back, the transformers' matmuls of 0.5 GFLOP and up do.
MIN_DATA_TILED_MATMUL_FLOPS = 100_000_000
# IREE's plain CPU matmul code handles a dimension that is not a multiple of its tile through a
# remainder path: 260 rows (a ViT's 4 x 65 tokens) ran 1.2-1.6x slower than 256, data-tiled not.
MATMUL_TILE = 8


@dataclass(frozen=True)
class MatmulFlops:
    """What the data-tiling choice reads of a program: FLOPs of its convolutions and matmuls."""

    convolutions: int
    matmuls: int
    largest_matmul: int
    untiled_matmuls: int  # in matmuls with a dimension (M, K or N) not a multiple of MATMUL_TILE


def choose_data_tiling(target: str, flops: MatmulFlops) -> Choice:
    """Form "data-tiled" or "plain" for a whole program, from the target's flag study (the fastest
    whole step with and without data tiling: on a shared machine the least disturbed). Plain where
    convolutions carry most of the FLOPs (not faster on the CNNs); data-tiled where the largest
    matmul is big enough, or where most matmul FLOPs are in matmuls whose dimensions do not fit
    the plain code's tile (faster there)."""
    steps = load_table(target).get("flags", {}).get("step_ms", {})
    ratios = {model: sets[DATA_TILING_SET]["step_ms_min"] / sets[BASELINE_SET]["step_ms_min"]
              for model, sets in steps.items()
              if "step_ms_min" in sets.get(DATA_TILING_SET, {}) and "step_ms_min" in sets.get(BASELINE_SET, {})}
    if not ratios:
        return Choice("plain", f"no data-tiling measurements for target '{target}' (python -m bench.iree_study flags)")
    measured = "step time with data tiling, measured on " + target + ": " + ", ".join(
        f"{model} {ratio:.2f}x" for model, ratio in ratios.items())
    if flops.convolutions and flops.convolutions >= flops.matmuls:  # backend_report() lists them
        return Choice("plain", f"convolutions carry most of the FLOPs; {measured}")
    largest = f"largest matmul {flops.largest_matmul / 1e6:.0f} MFLOP"
    if flops.largest_matmul >= MIN_DATA_TILED_MATMUL_FLOPS:
        return Choice("data-tiled", f"matmuls carry most of the FLOPs, {largest}; {measured}")
    if 2 * flops.untiled_matmuls > flops.matmuls:
        return Choice("data-tiled", f"{largest}, but {100 * flops.untiled_matmuls / flops.matmuls:.0f}% of matmul "
                                    f"FLOPs have a dimension not a multiple of {MATMUL_TILE}; {measured}")
    return Choice("plain", f"{largest}, under {MIN_DATA_TILED_MATMUL_FLOPS / 1e6:.0f}; {measured}")
