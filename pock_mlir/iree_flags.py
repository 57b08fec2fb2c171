"""Every IREE compiler flag pock-mlir passes, and the named flag sets the flag study measures, in
this one place: the targets (pock_mlir/targets.py), the program's per-program choices
(pock_mlir/program.py), the tuner (pock_mlir/tuning) and the study (bench/iree_study.py) import them.

Spellings are those of iree-base-compiler 3.13 (`iree-compile --help`): the device is chosen with
TARGET_DEVICE (`local` for CPUs, whose code generator is then named by LOCAL_BACKENDS), and each
backend takes its own target flags.
"""

from __future__ import annotations

# -- what a flag takes a value of --------------------------------------------------------------

TARGET_DEVICE = "--iree-hal-target-device"
LOCAL_BACKENDS = "--iree-hal-local-target-device-backends"
CPU_TRIPLE = "--iree-llvmcpu-target-triple"
CPU_NAME = "--iree-llvmcpu-target-cpu"
CPU_FEATURES = "--iree-llvmcpu-target-cpu-features"
VULKAN_TARGET = "--iree-vulkan-target"
CUDA_TARGET = "--iree-cuda-target"


def flag(name: str, value: str) -> str:
    """`name=value`, as iree-compile takes a flag's value."""
    return f"{name}={value}"


# -- every compilation --------------------------------------------------------------------------

INPUT_TORCH = "--iree-input-type=torch"
# Every function takes the buffer for its intermediate values from the caller, who allocates it
# once (pock_mlir/runtime/workspace.py): 1x its transient memory instead of 2x, no page faults.
EXTERNAL_TRANSIENTS = "--iree-torch-externalize-transients"
# The two halves of one compilation (TrainingProgram.schedule): IREE's stream-phase IR between them
# holds its schedule.
TO_STREAM = "--compile-to=stream"
FROM_STREAM = "--compile-from=stream"

# -- the targets' own -------------------------------------------------------------------------

# Every CPU target's: im2col for convolutions measured faster forward here (python -m
# bench.iree_study convs; pock_mlir/tuning/host-*.json).
IM2COL = "--iree-global-opt-use-im2col-for-convs"
# Every CPU target's: no DWARF in the kernels, which nothing on a device reads and which cost
# compile time and about a quarter of a module's bytes.
NO_DEBUG_SYMBOLS = "--iree-llvmcpu-debug-symbols=false"
# Every CPU target's: a transpose followed by zero padding becomes the padding then the transpose.
# Without it, where a model changes layout around a depthwise convolution (ConvNeXt's channels-last
# LayerNorm), each kernel tap's window of the padded input was a copy dispatch of its own (48 per
# 7x7 convolution); with it, the bench models' steps compiled to the same modules or ran as fast
# (the flag study's "im2col+sink-transpose-through-pad" set, bench/runs/intel-xeon-6-207/NOTES.md).
SINK_TRANSPOSE_THROUGH_PAD = "--iree-global-opt-enable-sink-transpose-through-pad"
CPU_COMMON = (IM2COL, SINK_TRANSPOSE_THROUGH_PAD, NO_DEBUG_SYMBOLS)
# Vulkan: index math (class targets, gathers, torch's ignore_index) arrives as i64, which the
# portable Vulkan profiles cannot store and IREE 3.13 fails to emulate in some vector shapes (batch
# 64 cross-entropy); every index a training step on such a device handles fits in 32 bits.
DEMOTE_I64 = "--iree-input-demote-i64-to-i32"
# CUDA: IREE 3.13's reduction vector-distribution pipeline fails ("failed to distribute") on
# reductions over 64, 128, 256, ... elements and on bool counts, e.g. a softmax or cross-entropy
# over a vocabulary of 128; the default reduction pipeline compiles them.
CUDA_COMMON = ("--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",)

# -- chosen per program (pock-backend-switch; TrainingProgram.iree_flags) --------------------------

# x86 CPUs: where a loop's trip count is not a multiple of the vector width, IREE 3.13 vectorizes
# the remainder with masked operations on AVX-512 by default, which ran several times slower than
# peeling it off into a loop of its own (a ViT's softmax over 65 tokens), but faster on some whole
# steps of some CPUs: pock-backend-switch chooses per program where the target's flag study measured
# both (tuning.choose_vector_tails), and the target's own choice stands elsewhere.
PEELED_VECTOR_TAILS = "--iree-llvmcpu-vector-pproc-strategy=peel"
MASKED_VECTOR_TAILS = "--iree-llvmcpu-vector-pproc-strategy=mask"
CHOSEN_VECTOR_TAILS = {"masked": (MASKED_VECTOR_TAILS,), "peeled": (PEELED_VECTOR_TAILS,), "target default": ()}
# IREE's data tiling through the global-optimization phase. Its default path (OPT_DATA_TILING)
# fails in IREE 3.13 on bool tensors passed between dispatches, e.g. attention's masked-row guard.
DATA_TILING = "--iree-global-opt-data-tiling"
OPT_DATA_TILING = "--iree-opt-data-tiling"
CHOSEN_DATA_TILING = {"data-tiled": (DATA_TILING,), "plain": ()}
# IREE's aggressive fusion, which forms fewer, larger dispatches (an optimizer update fused into the
# matmul of its gradient, for example). IREE 3.13 fails to compile some transformer steps with it.
AGGRESSIVE_FUSION = "--iree-dispatch-creation-enable-aggressive-fusion"
CHOSEN_FUSION = {"aggressive": (AGGRESSIVE_FUSION,), "default": ()}
# For a program holding int8 weights: IREE 3.13 keeps elementwise producers out of matmul and
# convolution dispatches on the CPU, so each int8 weight's cast to float32 would be a dispatch of
# its own writing the whole float32 weight to the workspace. Allowing the fusion computes the cast
# tile by tile inside the consumer.
FUSE_MATMUL_PRODUCERS = "--iree-dispatch-creation-block-matmul-producer-fusion=false"

# -- only measured (bench/iree_study.py flags) --------------------------------------------------

UKERNELS = "--iree-llvmcpu-enable-ukernels=all"
OPT_LEVEL_O3 = "--iree-opt-level=O3"

# -- the named flag sets of the flag study ------------------------------------------------------

# the sets the per-program choices read (pock_mlir/tuning)
BASELINE_SET = "im2col"
DATA_TILING_SET = "im2col+global-data-tiling"
MASKED_TAILS_SET = "im2col+masked-tails"
DATA_TILED_MASKED_TAILS_SET = "im2col+global-data-tiling+masked-tails"
AGGRESSIVE_FUSION_SET = "im2col+aggressive-fusion"
DATA_TILED_AGGRESSIVE_FUSION_SET = "im2col+global-data-tiling+aggressive-fusion"
MASKED_AGGRESSIVE_FUSION_SET = "im2col+masked-tails+aggressive-fusion"
DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET = "im2col+global-data-tiling+masked-tails+aggressive-fusion"

# Data tiling, vector tails and fusion are also chosen per program; every set says each, so that
# the sets compare what their names say on every program.
NO_DATA_TILING = f"{DATA_TILING}=false"
NO_AGGRESSIVE_FUSION = f"{AGGRESSIVE_FUSION}=false"
FLAG_SETS = {
    BASELINE_SET: (IM2COL, PEELED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    MASKED_TAILS_SET: (IM2COL, MASKED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    "none": (PEELED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    "im2col+ukernels": (IM2COL, UKERNELS, PEELED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    "im2col+ukernels+O3": (IM2COL, UKERNELS, OPT_LEVEL_O3, PEELED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    "im2col+ukernels+aggressive-fusion": (IM2COL, UKERNELS, AGGRESSIVE_FUSION, PEELED_VECTOR_TAILS, NO_DATA_TILING),
    "im2col+data-tiling": (IM2COL, OPT_DATA_TILING, PEELED_VECTOR_TAILS, NO_DATA_TILING, NO_AGGRESSIVE_FUSION),
    "im2col+sink-transpose-through-pad": (
        IM2COL,
        SINK_TRANSPOSE_THROUGH_PAD,
        PEELED_VECTOR_TAILS,
        NO_DATA_TILING,
        NO_AGGRESSIVE_FUSION,
    ),
    DATA_TILING_SET: (IM2COL, PEELED_VECTOR_TAILS, DATA_TILING, NO_AGGRESSIVE_FUSION),
    DATA_TILED_MASKED_TAILS_SET: (IM2COL, MASKED_VECTOR_TAILS, DATA_TILING, NO_AGGRESSIVE_FUSION),
    AGGRESSIVE_FUSION_SET: (IM2COL, AGGRESSIVE_FUSION, PEELED_VECTOR_TAILS, NO_DATA_TILING),
    DATA_TILED_AGGRESSIVE_FUSION_SET: (IM2COL, AGGRESSIVE_FUSION, PEELED_VECTOR_TAILS, DATA_TILING),
    MASKED_AGGRESSIVE_FUSION_SET: (IM2COL, AGGRESSIVE_FUSION, MASKED_VECTOR_TAILS, NO_DATA_TILING),
    DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET: (IM2COL, AGGRESSIVE_FUSION, MASKED_VECTOR_TAILS, DATA_TILING),
}
