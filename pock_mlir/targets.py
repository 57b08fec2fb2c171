"""Compilation targets: each name maps to its IREE device, backend, flags and runtime drivers in
this one place, the table TARGETS, which resolve_target, the tools' --target and --device help and
their checks read. The flags themselves are spelled in pock_mlir/iree_flags.py.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable
from dataclasses import dataclass

from pock_mlir.iree_flags import (
    CPU_COMMON,
    CPU_FEATURES,
    CPU_NAME,
    CPU_TRIPLE,
    CUDA_COMMON,
    CUDA_TARGET,
    DEMOTE_I64,
    EXTERNAL_TRANSIENTS,
    LOCAL_BACKENDS,
    PEELED_VECTOR_TAILS,
    TARGET_DEVICE,
    VULKAN_TARGET,
    flag,
)


class TargetError(ValueError):
    pass


CPU_DRIVERS = ("local-task", "local-sync")
VULKAN_DRIVERS = ("vulkan",)
CUDA_DRIVERS = ("cuda",)
# IREE's default Vulkan target, named explicitly so that bundles record what they assume:
# the Android baseline 2022 profile runs on any Vulkan 1.1+ GPU (and on lavapipe).
PORTABLE_VULKAN = "vp_android_baseline_2022"
X86_64_CPUS = ("generic", "x86-64-v2", "x86-64-v3", "x86-64-v4")


@dataclass(frozen=True)
class Target:
    name: str  # the spec as given: "aarch64:+dotprod"
    hal_device: str  # iree_flags.TARGET_DEVICE
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
        device = [flag(TARGET_DEVICE, self.hal_device)]
        if self.hal_device == "local":
            device.append(flag(LOCAL_BACKENDS, self.backend))
        return device + list(self.flags) + [EXTERNAL_TRANSIENTS]

    def check_runtime(self, driver: str, machine: str | None = None) -> None:
        """Raise TargetError unless `driver` on this machine (or `machine`) can run the module."""
        if driver not in self.drivers:
            raise TargetError(
                f"a module compiled for target '{self.name}' ({self.description}) runs on device "
                f"{' or '.join(self.drivers)}, not '{driver}'"
            )
        machine = machine or platform.machine()
        if self.arch and _normalize_arch(machine) != self.arch:
            raise TargetError(
                f"a module compiled for target '{self.name}' needs an {self.arch} CPU; this machine is "
                f"{machine} (recompile with --target host or x86-64, or run it on the device)"
            )


def _normalize_arch(machine: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())


def host_arch() -> str:
    """This machine's architecture as the targets name it: x86_64 or aarch64."""
    return _normalize_arch(platform.machine())


def vector_tails(arch: str) -> tuple[str, ...]:
    """How a CPU target of `arch` vectorizes loop remainders unless chosen per program
    (iree_flags.PEELED_VECTOR_TAILS): peeled on x86, IREE's default elsewhere."""
    return (PEELED_VECTOR_TAILS,) if arch == "x86_64" else ()


def _cpu(spec: str, arch: str, flags: tuple[str, ...], description: str) -> Target:
    return Target(spec, "local", "llvm-cpu", CPU_DRIVERS, arch, flags + vector_tails(arch) + CPU_COMMON, description)


def _host(spec: str, option: str) -> Target:
    if option:
        raise TargetError(f"target 'host' takes no option, got '{option}'")
    return _cpu(spec, host_arch(), (flag(CPU_NAME, "host"),), "this machine's CPU, with every feature it has")


def _x86_64(spec: str, option: str) -> Target:
    cpu = option or "x86-64-v3"
    if cpu not in X86_64_CPUS:
        raise TargetError(f"x86-64 takes {', '.join(X86_64_CPUS)}, got '{cpu}'")
    return _cpu(
        spec, "x86_64", (flag(CPU_TRIPLE, "x86_64-unknown-linux-gnu"), flag(CPU_NAME, cpu)), f"portable x86-64 ({cpu})"
    )


def _aarch64(spec: str, option: str) -> Target:
    features = [f for f in option.split(",") if f]
    bad = [f for f in features if not re.fullmatch(r"[+-][a-z0-9.-]+", f)]
    if bad:
        raise TargetError(
            f"aarch64 takes CPU features like +dotprod,+sve (each starting with + or -), got {', '.join(bad)}"
        )
    flags = (flag(CPU_TRIPLE, "aarch64-unknown-linux-gnu"), flag(CPU_NAME, "generic"))
    if features:
        flags += (flag(CPU_FEATURES, ",".join(features)),)
    return _cpu(spec, "aarch64", flags, "ARM64 Linux/Android CPUs" + (f" with {option}" if features else ""))


def _vulkan(spec: str, option: str) -> Target:
    gpu = option or PORTABLE_VULKAN
    return Target(
        spec,
        "vulkan",
        "vulkan-spirv",
        VULKAN_DRIVERS,
        None,
        (flag(VULKAN_TARGET, gpu), DEMOTE_I64),
        f"Vulkan SPIR-V GPUs ({gpu})",
    )


def _cuda(spec: str, option: str) -> Target:
    sm = option or "sm_87"
    if not re.fullmatch(r"sm_\d{2,3}a?", sm):
        raise TargetError(f"cuda takes a compute capability like sm_87 (Jetson Orin) or sm_80, got '{sm}'")
    return Target(
        spec, "cuda", "cuda", CUDA_DRIVERS, None, (flag(CUDA_TARGET, sm), *CUDA_COMMON), f"NVIDIA GPUs ({sm})"
    )


@dataclass(frozen=True)
class TargetKind:
    """A row of TARGETS: a target name, what may follow it after a colon, and its runtime drivers."""

    name: str
    option: str  # how --help shows the option after "name:" ("" where it takes none)
    drivers: tuple[str, ...]
    resolve: Callable[[str, str], Target]  # (the spec, its option) -> the Target; TargetError for a bad option

    def usage(self) -> str:
        return f"{self.name}[:{self.option}]" if self.option else self.name


TARGETS = {
    kind.name: kind
    for kind in (
        TargetKind("host", "", CPU_DRIVERS, _host),
        TargetKind("x86-64", "|".join(X86_64_CPUS), CPU_DRIVERS, _x86_64),
        TargetKind("aarch64", "+dotprod,+sve,...", CPU_DRIVERS, _aarch64),
        TargetKind("vulkan", "GPU, e.g. valhall4", VULKAN_DRIVERS, _vulkan),
        TargetKind("cuda", "sm_XX, e.g. sm_87 for Jetson Orin", CUDA_DRIVERS, _cuda),
    )
}
# every runtime driver some target's modules run on, the default CPU one first
DRIVERS = tuple(dict.fromkeys(driver for kind in TARGETS.values() for driver in kind.drivers))


def target_help() -> str:
    """The targets as a tool's --target help lists them."""
    return ", ".join(kind.usage() + (" (default)" if kind.name == "host" else "") for kind in TARGETS.values())


def resolve_target(spec: str) -> Target:
    """'host', 'x86-64', 'x86-64:generic', 'aarch64', 'aarch64:+dotprod,+sve', 'vulkan', 'vulkan:valhall4', 'cuda:sm_87'."""
    name, _, option = spec.partition(":")
    if name not in TARGETS:
        raise TargetError(f"unknown target '{spec}'; use one of {', '.join(k.usage() for k in TARGETS.values())}")
    return TARGETS[name].resolve(spec, option)
