"""Compilation targets: each name maps to its IREE device, backend and flags in this one place.

Flag names are those of iree-base-compiler 3.13 (`iree-compile --help`): the device is chosen
with `--iree-hal-target-device` (`local` for CPUs, whose code generator is then named by
`--iree-hal-local-target-device-backends`), and each backend takes its own target flags.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass


class TargetError(ValueError):
    pass


CPU_DRIVERS = ("local-task", "local-sync")
# Every function takes the buffer for its intermediate values from the caller, who allocates it
# once (pock_mlir/runtime/workspace.py): 1x its transient memory instead of 2x, no page faults.
EXTERNAL_TRANSIENTS = "--iree-torch-externalize-transients"
# IREE's default Vulkan target, named explicitly so that bundles record what they assume:
# the Android baseline 2022 profile runs on any Vulkan 1.1+ GPU (and on lavapipe).
PORTABLE_VULKAN = "vp_android_baseline_2022"
X86_64_CPUS = ("generic", "x86-64-v2", "x86-64-v3", "x86-64-v4")


@dataclass(frozen=True)
class Target:
    name: str  # the spec as given: "aarch64:+dotprod"
    hal_device: str  # --iree-hal-target-device
    backend: str  # the code generator of executables
    drivers: tuple[str, ...]  # IREE runtime drivers that can run the module; the first is the default
    arch: str | None  # the CPU architecture a CPU module needs (platform.machine() spelling); None for GPUs
    flags: tuple[str, ...]  # backend flags
    description: str

    @property
    def device(self) -> str:
        """The runtime driver used unless told otherwise."""
        return self.drivers[0]

    def compile_flags(self) -> list[str]:
        device = [f"--iree-hal-target-device={self.hal_device}"]
        if self.hal_device == "local":
            device.append(f"--iree-hal-local-target-device-backends={self.backend}")
        return device + list(self.flags) + [EXTERNAL_TRANSIENTS]

    def check_runtime(self, driver: str, machine: str | None = None) -> None:
        """Raise TargetError unless `driver` on this machine (or `machine`) can run the module."""
        if driver not in self.drivers:
            raise TargetError(f"a module compiled for target '{self.name}' ({self.description}) runs on device "
                              f"{' or '.join(self.drivers)}, not '{driver}'")
        machine = machine or platform.machine()
        if self.arch and _normalize_arch(machine) != self.arch:
            raise TargetError(f"a module compiled for target '{self.name}' needs an {self.arch} CPU; this machine is "
                              f"{machine} (recompile with --target host or x86-64, or run it on the device)")


def _normalize_arch(machine: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())


def host_arch() -> str:
    """This machine's architecture as the targets name it: x86_64 or aarch64."""
    return _normalize_arch(platform.machine())


# Flags every CPU target shares: im2col for convolutions measured faster forward here
# (python -m bench.iree_study convs; pock_mlir/tuning/host-*.json); no DWARF in the kernels, which
# nothing on a device reads and which cost compile time and about a quarter of a module's bytes.
_CPU_COMMON = ("--iree-global-opt-use-im2col-for-convs", "--iree-llvmcpu-debug-symbols=false")
# x86 CPUs: where a loop's trip count is not a multiple of the vector width, IREE 3.13 vectorizes
# the remainder with masked operations on AVX-512 by default, which ran several times slower than
# peeling it off into a loop of its own (a ViT's softmax over 65 tokens), but faster on some whole
# steps of some CPUs: pock-backend-switch chooses per program where the target's flag study measured
# both (tuning.choose_vector_tails), and the target's own choice stands elsewhere.
PEELED_VECTOR_TAILS = "--iree-llvmcpu-vector-pproc-strategy=peel"
MASKED_VECTOR_TAILS = "--iree-llvmcpu-vector-pproc-strategy=mask"
CHOSEN_VECTOR_TAILS = {"masked": (MASKED_VECTOR_TAILS,), "peeled": (PEELED_VECTOR_TAILS,), "target default": ()}


def vector_tails(arch: str) -> tuple[str, ...]:
    """How a CPU target of `arch` vectorizes loop remainders unless chosen per program: peeled on
    x86, IREE's default elsewhere."""
    return (PEELED_VECTOR_TAILS,) if arch == "x86_64" else ()


# Per program, where pock-backend-switch chooses it (TrainingProgram.iree_flags): IREE's data
# tiling through the global-optimization phase. Its default path (--iree-opt-data-tiling) fails
# in IREE 3.13 on bool tensors passed between dispatches, e.g. attention's masked-row guard.
DATA_TILING = "--iree-global-opt-data-tiling"
# Per program, where pock-backend-switch chooses it (tuning.choose_fusion): IREE's aggressive
# fusion, which forms fewer, larger dispatches (an optimizer update fused into the matmul of its
# gradient, for example). IREE 3.13 fails to compile some transformer steps with it.
AGGRESSIVE_FUSION = "--iree-dispatch-creation-enable-aggressive-fusion"
CHOSEN_FUSION = {"aggressive": (AGGRESSIVE_FUSION,), "default": ()}
# Per program, when it holds int8 weights (TrainingProgram.iree_flags): IREE 3.13 keeps elementwise
# producers out of matmul and convolution dispatches on the CPU, so each int8 weight's cast to
# float32 would be a dispatch of its own writing the whole float32 weight to the workspace.
# Allowing the fusion computes the cast tile by tile inside the consumer.
FUSE_MATMUL_PRODUCERS = "--iree-dispatch-creation-block-matmul-producer-fusion=false"


# IREE 3.13's reduction vector-distribution pipeline fails ("failed to distribute") on reductions
# over 64, 128, 256, ... elements and on bool counts, e.g. a softmax or cross-entropy over a
# vocabulary of 128; the default reduction pipeline compiles them.
_CUDA_COMMON = ("--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",)


def _cpu(spec: str, arch: str, flags: tuple[str, ...], description: str) -> Target:
    return Target(spec, "local", "llvm-cpu", CPU_DRIVERS, arch, flags + vector_tails(arch) + _CPU_COMMON, description)


def resolve_target(spec: str) -> Target:
    """'host', 'x86-64', 'x86-64:generic', 'aarch64', 'aarch64:+dotprod,+sve', 'vulkan', 'vulkan:valhall4', 'cuda:sm_87'."""
    name, _, option = spec.partition(":")
    if name == "host":
        if option:
            raise TargetError(f"target 'host' takes no option, got '{option}'")
        return _cpu(spec, host_arch(), ("--iree-llvmcpu-target-cpu=host",),
                    "this machine's CPU, with every feature it has")
    if name == "x86-64":
        cpu = option or "x86-64-v3"
        if cpu not in X86_64_CPUS:
            raise TargetError(f"x86-64 takes {', '.join(X86_64_CPUS)}, got '{cpu}'")
        return _cpu(spec, "x86_64", ("--iree-llvmcpu-target-triple=x86_64-unknown-linux-gnu",
                                     f"--iree-llvmcpu-target-cpu={cpu}"), f"portable x86-64 ({cpu})")
    if name == "aarch64":
        features = [f for f in option.split(",") if f]
        bad = [f for f in features if not re.fullmatch(r"[+-][a-z0-9.-]+", f)]
        if bad:
            raise TargetError(f"aarch64 takes CPU features like +dotprod,+sve (each starting with + or -), got "
                              f"{', '.join(bad)}")
        flags = ("--iree-llvmcpu-target-triple=aarch64-unknown-linux-gnu", "--iree-llvmcpu-target-cpu=generic")
        if features:
            flags += (f"--iree-llvmcpu-target-cpu-features={','.join(features)}",)
        return _cpu(spec, "aarch64", flags, "ARM64 Linux/Android CPUs" + (f" with {option}" if features else ""))
    if name == "vulkan":
        gpu = option or PORTABLE_VULKAN
        # Index math (class targets, gathers, torch's ignore_index) arrives as i64, which the portable
        # Vulkan profiles cannot store and IREE 3.13 fails to emulate in some vector shapes (batch 64
        # cross-entropy); every index a training step on such a device handles fits in 32 bits.
        return Target(spec, "vulkan", "vulkan-spirv", ("vulkan",), None,
                      (f"--iree-vulkan-target={gpu}", "--iree-input-demote-i64-to-i32"), f"Vulkan SPIR-V GPUs ({gpu})")
    if name == "cuda":
        sm = option or "sm_87"
        if not re.fullmatch(r"sm_\d{2,3}a?", sm):
            raise TargetError(f"cuda takes a compute capability like sm_87 (Jetson Orin) or sm_80, got '{sm}'")
        return Target(spec, "cuda", "cuda", ("cuda",), None, (f"--iree-cuda-target={sm}", *_CUDA_COMMON),
                      f"NVIDIA GPUs ({sm})")
    raise TargetError(f"unknown target '{spec}'; use host, x86-64[:cpu], aarch64[:features], vulkan[:gpu] or "
                      f"cuda[:sm_XX]")
