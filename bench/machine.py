"""Where this machine's measurements go: bench/runs/<machine>/, named by the CPU's vendor, family
and model (pock_mlir.tuning.host_cpu), for every bench script that writes per-machine results."""

from __future__ import annotations

from pathlib import Path

from pock_mlir.tuning import host_cpu

RUNS = Path(__file__).resolve().parent / "runs"


def runs_dir() -> Path:
    """bench/runs/<vendor brand>-<family>-<model>, e.g. bench/runs/amd-epyc-25-17."""
    vendor, family, model = host_cpu().split("-")[1:4]
    brand = {"GenuineIntel": "intel-xeon", "AuthenticAMD": "amd-epyc"}.get(vendor, vendor.lower())
    return RUNS / f"{brand}-{family}-{model}"
