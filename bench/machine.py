"""Where this machine's measurements go: bench/runs/<machine>/, named by the CPU's vendor, family
and model (pock_mlir.tuning.host_cpu), for every bench script that writes per-machine results."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

from pock_mlir.files import atomic_write
from pock_mlir.tuning import host_cpu

RUNS = Path(__file__).resolve().parent / "runs"


def runs_dir() -> Path:
    """bench/runs/<vendor brand>-<family>-<model>, e.g. bench/runs/amd-epyc-25-17."""
    vendor, family, model = host_cpu().split("-")[1:4]
    brand = {"GenuineIntel": "intel-xeon", "AuthenticAMD": "amd-epyc"}.get(vendor, vendor.lower())
    return RUNS / f"{brand}-{family}-{model}"


def measure_rows(
    path: Path, names: list[str], measure: Callable[[str], dict], tool: str, after=lambda results, name: None, **facts
) -> dict:
    """Measure each of `names` into the results file at `path` ({"rows": {name: row}, **facts}),
    keeping the rows of other names an earlier run wrote there. Each row is dated and written as
    soon as it is measured (a run cut short keeps what it measured), then `after(results, name)`."""
    results = json.loads(path.read_text()) if path.exists() else {"rows": {}}
    results.update(facts)
    for name in names:
        print(f"{tool}: {name}", file=sys.stderr, flush=True)
        row = measure(name)
        row["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        results["rows"][name] = row
        atomic_write(path, json.dumps(results, indent=1) + "\n")
        after(results, name)
    return results
