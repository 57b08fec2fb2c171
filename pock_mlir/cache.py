"""A persistent cache of IREE's output, keyed by everything that decides it.

IREE's half of a compilation is most of its time (see `program.compile_report()`), and a user
re-running a script, or a test session compiling the same model twice, gives it the same input.
An entry's key is the sha256 of the IREE compiler's version, the flags, the lowered IR and, for
a module compiled for `target-cpu=host`, this CPU's features (a cache directory shared by machines
never hands one another's host code to a CPU that lacks its instructions); the entry is the
module and the facts derived from IREE's schedule (pock_mlir/in_place.py), with the module's own
sha256, so a damaged entry is recompiled, never loaded. Where IREE failed under the
aggressive fusion pock-backend-switch chose, the entry is the failure (`<key>.failed.json`), so
that the program goes straight to its fallback (TrainingProgram.fusion) the next time.

On by default, in $POCK_MLIR_CACHE_DIR, else $XDG_CACHE_HOME/pock-mlir, else ~/.cache/pock-mlir.
POCK_MLIR_CACHE=off (or `compile_training(cache=False)`, `pock-compile --no-cache`) turns it off.
The cache keeps the most recently used entries within MAX_BYTES; deleting the directory is safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path

from pock_mlir.files import atomic_write

MAX_BYTES = 2 << 30


def directory() -> Path | None:
    """Where the cache lives, or None when POCK_MLIR_CACHE turns it off."""
    if os.environ.get("POCK_MLIR_CACHE", "on").lower() in ("off", "0", "false", "no"):
        return None
    if os.environ.get("POCK_MLIR_CACHE_DIR"):
        return Path(os.environ["POCK_MLIR_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pock-mlir"


def key(ir_text: str, flags: list[str]) -> str:
    from iree.compiler import version

    digest = hashlib.sha256(f"iree-base-compiler {version.VERSION}\n".encode())
    digest.update(json.dumps(flags).encode())
    if any(flag.endswith("-target-cpu=host") for flag in flags):
        digest.update(_host_cpu().encode())
    digest.update(ir_text.encode())
    return digest.hexdigest()


def _host_cpu() -> str:
    """The CPU's architecture and, on Linux, its model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [
                line for line in f if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")
            ]
    except OSError:
        lines = []
    return platform.machine() + "\n" + "".join(dict.fromkeys(lines))


def load(root: Path, entry: str) -> tuple[bytes, dict] | None:
    """The module and facts of an entry, or None if it is absent or damaged."""
    try:
        facts = json.loads((root / f"{entry}.json").read_text())
        module = (root / f"{entry}.vmfb").read_bytes()
    except (OSError, ValueError):
        return None
    if (
        not isinstance(facts, dict)
        or facts.get("sha256") != hashlib.sha256(module).hexdigest()
        or not isinstance(facts.get("in_place"), list)
    ):  # entries from before it was a list: recompiled
        return None
    for path in (root / f"{entry}.json", root / f"{entry}.vmfb"):
        try:
            os.utime(path)  # most recently used: the last to go
        except OSError:  # a read-only cache is still a cache
            pass
    return module, facts


def store(root: Path, entry: str, module: bytes, facts: dict) -> None:
    """Add an entry (the module first, so its facts never name a missing one), then trim the
    cache to MAX_BYTES. A cache that cannot be written only costs time: a warning says why."""
    _write(
        root,
        {f"{entry}.vmfb": module, f"{entry}.json": json.dumps({**facts, "sha256": hashlib.sha256(module).hexdigest()})},
    )


def store_failure(root: Path, entry: str, error: str) -> None:
    """Record that IREE failed on an entry's input, with `error`, its one-line reason (as store)."""
    _write(root, {f"{entry}.failed.json": json.dumps({"error": error})})


def _write(root: Path, files: dict) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            atomic_write(root / name, content)
        _trim(root)
    except OSError as e:
        warnings.warn(
            f"pock-mlir's compile cache in {root} cannot be written ({e}); set POCK_MLIR_CACHE_DIR "
            f"to a writable directory or POCK_MLIR_CACHE=off",
            stacklevel=3,
        )


def failure(root: Path, entry: str) -> str | None:
    """The error recorded by store_failure for an entry, or None."""
    try:
        error = json.loads((root / f"{entry}.failed.json").read_text()).get("error")
    except (OSError, ValueError, AttributeError):
        return None
    return error if isinstance(error, str) else None


def _trim(root: Path) -> None:
    """Delete the least recently used files beyond MAX_BYTES (another process may be trimming too)."""
    files = []
    for path in root.iterdir():
        try:
            if path.suffix in (".vmfb", ".json"):
                files.append((path.stat(), path))
        except FileNotFoundError:
            continue
    total = 0
    for stat, path in sorted(files, key=lambda f: f[0].st_mtime, reverse=True):
        total += stat.st_size
        if total > MAX_BYTES:
            path.unlink(missing_ok=True)
