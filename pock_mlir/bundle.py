"""Writing device bundles: `write_bundle` (a compiled program, as pock-compile writes it) and
`write_trained_bundle` (a bundle starting from trained weights). The format, and reading it back,
are pock_mlir/runtime/bundle.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from pock_mlir.abi import FUNCTIONS, SEED_INPUT, TRAIN_STEP, TRAIN_STEP_INTO, StepSignature, TensorSpec, layout
from pock_mlir.files import TEMPORARY_PREFIX, fsync_directory, is_temporary, staging_directory
from pock_mlir.runtime.bundle import (
    ARGS,
    FORMAT,
    FORMAT_VERSION,
    FUNCTIONS_JSON,
    HF,
    MANIFEST,
    MODULE,
    OPTIMIZER,
    PARAMS,
    RUN_STEP,
    Bundle,
    BundleError,
    file_sha256,
    step_argument_files,
)
from pock_mlir.runtime.workspace import module_transient_bytes

VERSIONED_PACKAGES = ("pock-mlir", "iree-base-compiler", "iree-base-runtime", "torch", "torch-mlir")

BUNDLED_FUNCTIONS = tuple(f for f in FUNCTIONS if f != TRAIN_STEP_INTO)  # what iree-run-module users call


def function_abi(signature: StepSignature) -> dict[str, dict[str, list[dict]]]:
    """functions.json: each bundled function's "arguments" and "results" in ABI order, each with
    its file relative to args/ (or to run_step.sh's output directory), name, shape and dtype."""
    return {
        name: {
            part: [{"path": slot.path, **slot.spec.to_json()} for slot in slots]
            for part, slots in zip(("arguments", "results"), layout(signature, name))
        }
        for name in BUNDLED_FUNCTIONS
    }


def _versions() -> dict[str, str]:
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _loss_name(loss) -> str:
    return loss if isinstance(loss, str) else f"custom:{getattr(loss, '__qualname__', type(loss).__name__)}"


def _as_array(value, spec) -> np.ndarray:
    """A batch tensor in the device's dtype (int64 targets travel as int32, see pock_mlir.frontend)."""
    array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
    if tuple(array.shape) != tuple(spec.shape):
        raise BundleError(f"{spec.name}: the example batch has shape {array.shape}, the module takes {spec.shape}")
    return np.require(array.astype(spec.dtype, copy=False), requirements="C")


def _manifest(program, *, model_file: str | None, loss, sparse) -> dict:
    sig, target, optimizer = program.signature, program.target, program.optimizer
    vmfb = program.vmfb  # compiled before the flags are read: a fallback in compiling changes them (program.fusion)
    policies = {p.name: sig.policies.get(p.name) for p in sig.params}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model_file,
        "target": {
            "name": target.name,
            "description": target.description,
            "hal_device": target.hal_device,
            "backend": target.backend,
            "drivers": list(target.drivers),
            "driver": program.driver.form,  # the one chosen for this program (TrainingProgram.driver)
            "driver_reason": program.driver.reason,
            "arch": target.arch,
            "iree_compile_flags": program.iree_flags(),
        },
        "versions": _versions(),
        # the workspace each function takes (pock_mlir/runtime/workspace.py)
        "module": {
            "file": MODULE,
            "workspace_bytes": {name: module_transient_bytes(vmfb, name) for name in BUNDLED_FUNCTIONS},
            "in_place": sorted(program.in_place),
        },
        "loss": _loss_name(loss),
        "optimizer": {"name": type(optimizer).__name__.lower(), **dataclasses.asdict(optimizer)},
        "sparse": {
            "scheme": program.scheme.source,
            "config": None if sparse is None else str(sparse),
            "policies": {
                name: dataclasses.asdict(p) if p else {"kind": "full", "ratio": 1.0} for name, p in policies.items()
            },
        },
        "lora": [adapter.to_json() for adapter in sig.adapters],
        "quantized": [weight.to_json() for weight in sig.quantized],
        "params": [p.to_json() for p in sig.params],
        "buffers": [b.to_json() for b in sig.buffers],
        "updated_buffers": list(sig.updated_buffers),
        "state_dict": dict(sig.state_dict),
        "trainable": list(sig.trainable),
        "optimizer_state": [s.to_json() for s in sig.state],
        # the last by_keyword model inputs are the model's keyword arguments, named by keyword
        "batch": {
            "inputs": [i.to_json() for i in sig.inputs],
            "by_keyword": sig.by_keyword,
            "target": sig.target.to_json(),
            "vocabularies": dict(sig.vocabularies),
        },
        "output": sig.output.to_json(),
        "hf_files": sorted(program.hf_files),  # in hf/
        "files": {
            "functions": FUNCTIONS_JSON,
            "parameters": PARAMS,
            "optimizer_state": OPTIMIZER,
            "arguments": ARGS + "/",
            "run_step": RUN_STEP,
        },
        "sha256": {},  # every file of the bundle but this manifest, by relative path: filled once they are written
    }


def run_step_script(manifest: dict, functions: dict) -> str:
    """run_step.sh: one train_step with the stock iree-run-module, arguments from args/ (`functions`:
    function_abi's)."""
    step = functions[TRAIN_STEP]
    state_dirs = sorted({r["path"].split("/")[0] for r in step["results"] if "/" in r["path"]})
    inputs = "".join(f'  --input=@"$bundle/{ARGS}/{a["path"]}" \\\n' for a in step["arguments"])
    inputs += f'  --input="&{manifest["module"]["workspace_bytes"][TRAIN_STEP]}xi8" \\\n'
    outputs = " \\\n".join(f'  --output=@"$out/{r["path"]}"' for r in step["results"])
    target = manifest["target"]
    seed_note = "".join(
        f"\n# args/{a['path']} seeds the dropout masks: give each step another value (pock-train uses the step number)."
        for a in step["arguments"]
        if a["name"] == SEED_INPUT
    )
    return f"""#!/bin/sh
# One training step of this bundle (target {target["name"]}: {target["description"]}) with IREE's
# stock runtime; no Python needed.
#
#   ./run_step.sh [OUT_DIR]        (OUT_DIR defaults to ./out)
#
# Reads the train_step arguments from args/ next to this script: the parameters, buffers and
# optimizer state as compiled and a batch (args/batch/*.npy: replace them with your own data of
# the same shapes and dtypes, see manifest.json). Writes the loss and the updated state to
# OUT_DIR under the paths they have in args/, so that
#   cp -R {" ".join(f"OUT_DIR/{d}" for d in state_dirs)} args/
# makes the next run continue training from there. The last input is the workspace for the
# step's intermediate values (its size is recorded in the module; "&" leaves it uninitialised).{seed_note}
#
# IREE_RUN_MODULE: the iree-run-module command (default: the one on PATH), e.g. for an ARM module
#   on an x86 machine: "qemu-aarch64 -L /usr/aarch64-linux-gnu /path/to/aarch64/iree-run-module".
# IREE_DEVICE: the IREE driver (default {target["driver"]}, chosen for this program; this module runs on {", ".join(target["drivers"])}).
set -eu
bundle=$(cd "$(dirname "$0")" && pwd)
out=${{1:-out}}
runtime=${{IREE_RUN_MODULE:-iree-run-module}}
# Check the runtime command before running it: a missing one would otherwise fail without a word.
for word in $runtime; do
  case $word in
    -*) ;;
    */*) [ -e "$word" ] || {{ echo "run_step.sh: '$word' in IREE_RUN_MODULE does not exist (relative paths are taken from $(pwd); give an absolute one)" >&2; exit 127; }} ;;
  esac
done
set -- $runtime
command -v "$1" >/dev/null 2>&1 || {{ echo "run_step.sh: runtime command '$1' not found: put IREE's iree-run-module on PATH (pip install iree-base-runtime) or name it in IREE_RUN_MODULE" >&2; exit 127; }}
mkdir -p {" ".join(f'"$out/{d}"' for d in state_dirs)}
status=0
# $runtime is split into words on purpose: it may be a command with arguments.
$runtime \\
  --device="${{IREE_DEVICE:-{target["driver"]}}}" \\
  --module="$bundle/{MODULE}" \\
  --function={TRAIN_STEP} \\
{inputs}{outputs} || status=$?
if [ "$status" -ne 0 ]; then
  echo "run_step.sh: '$runtime' failed with exit code $status" >&2
  exit "$status"
fi
"""


BUNDLE_ENTRIES = (MANIFEST, MODULE, PARAMS, OPTIMIZER, ARGS, RUN_STEP, HF)  # what write_bundle writes


def _is_bundle(directory: Path) -> bool:
    """Whether `directory` provably holds a pock bundle: its manifest parses and names the format."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def kept_files(destination: Path) -> list[str]:
    """What an existing bundle directory holds besides the bundle (pock-train's export and
    checkpoints, the user's notes): recompiling keeps them."""
    if not destination.is_dir():
        return []
    return sorted(p.name for p in destination.iterdir() if p.name not in BUNDLE_ENTRIES and not is_temporary(p.name))


def _replace_directory(staged: Path, destination: Path) -> None:
    """Move a fully written bundle into place. An existing bundle there is replaced; the files
    it holds besides the bundle move into the new one first."""
    if not destination.exists():
        os.replace(staged, destination)
        return
    for name in kept_files(destination):
        os.replace(destination / name, staged / name)
    retired = Path(tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{destination.name}.old.", dir=destination.parent))
    os.replace(destination, retired / destination.name)
    os.replace(staged, destination)
    shutil.rmtree(retired)
    fsync_directory(destination.parent)


def check_destination(directory) -> Path:
    """The bundle directory to write: new, empty, or an earlier bundle (which is replaced, keeping
    the files it holds besides the bundle)."""
    destination = Path(directory)
    if destination.is_symlink():
        raise BundleError(f"{destination} is a symbolic link; give the directory itself")
    if destination.exists() and not destination.is_dir():
        raise BundleError(f"{destination} exists and is not a directory; choose another output directory")
    if destination.is_dir() and any(destination.iterdir()) and not _is_bundle(destination):
        raise BundleError(
            f"{destination} exists and is not a pock bundle (no {MANIFEST} naming format "
            f"'{FORMAT}'); choose another output directory"
        )
    if not destination.parent.exists():
        return destination
    if not os.access(destination.parent, os.W_OK | os.X_OK):
        raise BundleError(f"cannot write {destination}: directory {destination.parent} is not writable")
    return destination


@contextlib.contextmanager
def _staged_bundle(destination: Path):
    """A staging directory beside `destination` to write a bundle in; removed if writing fails."""
    staged = staging_directory(destination)
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def _publish(staged: Path, manifest: dict, destination: Path) -> None:
    """Seal the staged bundle (the manifest records every file's sha256) and put it in place."""
    manifest["sha256"] = {str(f.relative_to(staged)): file_sha256(f) for f in sorted(staged.rglob("*")) if f.is_file()}
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _replace_directory(staged, destination)


SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "float64": "F64",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "bool": "BOOL",
}


def write_safetensors(file, specs: list[TensorSpec], values):
    """Write the safetensors format into `file` one tensor at a time: the header from `specs`,
    then each of `values` (an iterable, in the specs' order), yielding each once written
    (safetensors' own writers take every tensor at once)."""
    header, offset = {}, 0
    for spec in specs:
        size = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        header[spec.name] = {
            "dtype": SAFETENSORS_DTYPES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    file.write(len(text).to_bytes(8, "little") + text)
    for spec, value in zip(specs, values, strict=True):
        value = np.require(value, requirements="C")
        if value.shape != tuple(spec.shape) or value.dtype != np.dtype(spec.dtype):
            raise BundleError(
                f"{spec.name}: the value is {value.dtype}{list(value.shape)}, not {spec.dtype}{list(spec.shape)}"
            )
        file.write(value.reshape(-1).view(np.uint8))
        yield value


def write_bundle(program, directory, *, example_inputs, example_target, loss, model_file=None, sparse=None) -> Path:
    """Write `program` as a device bundle into `directory` (see the module docstring).

    example_inputs/example_target: the batch the program was compiled for, written to args/batch/
    so that run_step.sh runs as it is. Nothing appears at `directory` unless the whole bundle was
    written."""
    destination = check_destination(directory)
    destination.parent.mkdir(parents=True, exist_ok=True)
    sig = program.signature
    manifest = _manifest(program, model_file=model_file, loss=loss, sparse=sparse)
    functions = function_abi(sig)
    try:
        inputs = sig.flat_inputs(example_inputs)
    except ValueError as e:
        raise BundleError(f"the example batch: {e}") from None
    batch = {spec.name: _as_array(value, spec) for spec, value in zip(sig.model_inputs, inputs)}
    batch["target"] = _as_array(example_target, sig.target)
    if any(spec.name == SEED_INPUT for spec in sig.inputs):
        batch[SEED_INPUT] = np.zeros((), np.int32)  # the first step's dropout masks
    optimizer_state = {s.name: np.zeros(s.shape, np.float32) for s in sig.state} | {"step": np.zeros((), np.float32)}
    arguments = {}  # train_step's argument files, by group and name
    for file in step_argument_files(sig):
        group, name = file.split("/", 1)
        arguments.setdefault(group, {})[name.removesuffix(".npy")] = file

    with _staged_bundle(destination) as staged:
        (staged / MODULE).write_bytes(program.vmfb)
        (staged / FUNCTIONS_JSON).write_text(json.dumps(functions, indent=2) + "\n")
        for path in arguments.values():
            for file in path.values():
                (staged / ARGS / file).parent.mkdir(parents=True, exist_ok=True)
        # One tensor at a time, each where it goes: a program compiled with weights= reads each
        # from its checkpoint when asked (pock_mlir/weights.py), and the host holds no copy of all.
        state = [("params", spec, program.initial_params) for spec in sig.params] + [
            ("buffers", spec, program.initial_buffers) for spec in sig.buffers
        ]
        values = (held[spec.name] for _, spec, held in state)
        with open(staged / PARAMS, "wb") as file:
            written = write_safetensors(file, [spec for _, spec, _ in state], values)
            for (group, spec, _), value in zip(state, written):
                if spec.name in arguments.get(group, {}):
                    np.save(staged / ARGS / arguments[group][spec.name], value)
        (staged / OPTIMIZER).write_bytes(save(optimizer_state))
        values = {"optimizer": optimizer_state, "batch": batch}
        for group, files in arguments.items():
            for name, file in files.items() if group in values else ():
                np.save(staged / ARGS / file, values[group][name])
        (staged / RUN_STEP).write_text(run_step_script(manifest, functions))
        (staged / RUN_STEP).chmod(0o755)
        for name, content in program.hf_files.items():
            (staged / HF).mkdir(exist_ok=True)
            (staged / HF / name).write_text(json.dumps(content, indent=2) + "\n")
        _publish(staged, manifest, destination)
    return destination


def write_trained_bundle(bundle: Bundle, state: dict[str, np.ndarray], directory) -> Path:
    """A copy of `bundle` at `directory` that starts from `state` (a Trainer.state_dict(), e.g. a
    federation's global model) instead of the compiled weights: params.safetensors and args/
    rewritten (non-persistent buffers, which the state_dict does not hold, as compiled), the hashes
    recomputed, the optimizer state as compiled. Staged and moved into place as write_bundle does,
    so nothing appears at `directory` unless the whole bundle was written."""
    destination = check_destination(directory)
    if destination.resolve() == bundle.path.resolve():
        raise BundleError(f"{destination} is the bundle being copied; give another directory")
    destination.parent.mkdir(parents=True, exist_ok=True)
    sig = bundle.signature
    if sorted(state) != sorted(sig.keyed_specs):
        raise BundleError(
            "the state to write does not hold exactly the bundle's state_dict keys (Trainer.state_dict())"
        )
    compiled = {**bundle.initial_params, **bundle.initial_buffers}
    held = {name: state[keys[0]] if keys else compiled[name] for name, keys in sig.keys_of().items()}
    names = [s.name for s in sig.params + sig.buffers]
    manifest = json.loads(json.dumps(bundle.manifest))
    with _staged_bundle(destination) as staged:
        for name in manifest["sha256"]:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(bundle.path / name, staged / name)
        (staged / PARAMS).write_bytes(save({n: np.require(held[n], requirements="C") for n in names}))
        for file in bundle.step_argument_files:
            group, name = file.split("/", 1)
            if group in ("params", "buffers"):
                np.save(staged / ARGS / file, held[name.removesuffix(".npy")])
        _publish(staged, manifest, destination)
    return destination
