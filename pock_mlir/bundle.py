"""Device bundles: one folder with everything a device needs to train, without PyTorch.

    bundle/
      manifest.json          functions and their arguments, parameters, sparse scheme, target, versions
      module.vmfb            the IREE module: its functions as pock_mlir/abi.py lays them out
      params.safetensors     the model's state_dict as compiled (parameters and buffers)
      optimizer.safetensors  the optimizer state ("<param>.<slot>") and "step"
      args/                  one .npy per train_step argument, for iree-run-module --input=@FILE
      run_step.sh            one training step with the stock iree-run-module

The module takes the parameters as arguments (it reads no parameter archive), so args/ holds
them in the form iree-run-module reads; args/batch/ holds the example batch the module was
compiled for. Loading a bundle (`load_bundle`, `Trainer.from_bundle`) needs numpy, safetensors
and iree.runtime only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save

from pock_mlir import lora
from pock_mlir.quantize import QuantizedWeight
from pock_mlir.abi import FUNCTIONS, SEED_INPUT, STEP, Policy, StepSignature, TensorSpec, layout
from pock_mlir.program import CompiledModule
from pock_mlir.files import TEMPORARY_PREFIX, fsync_directory, is_temporary, staging_directory
from pock_mlir.runtime.workspace import module_transient_bytes
from pock_mlir.targets import Target, TargetError, resolve_target

FORMAT = "pock-bundle"
# 2: the module has a `loss` function; 3: every file's sha256; 4: LoRA adapters, int8 weights; 5: keyword inputs
FORMAT_VERSION = 5
MANIFEST, MODULE, PARAMS, OPTIMIZER, ARGS, RUN_STEP = (
    "manifest.json", "module.vmfb", "params.safetensors", "optimizer.safetensors", "args", "run_step.sh")
VERSIONED_PACKAGES = ("pock-mlir", "iree-base-compiler", "iree-base-runtime", "torch", "torch-mlir")


class BundleError(ValueError):
    pass


BUNDLED_FUNCTIONS = tuple(f for f in FUNCTIONS if f != "train_step_into")  # what iree-run-module users call


def function_abi(signature: StepSignature) -> dict[str, dict[str, list[tuple[str, TensorSpec]]]]:
    """Each bundled function's arguments and results as (relative .npy path, spec), in ABI order."""
    return {name: {part: [(slot.path, slot.spec) for slot in slots]
                   for part, slots in zip(("arguments", "results"), layout(signature, name))}
            for name in BUNDLED_FUNCTIONS}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _state_dict_sources(model, signature) -> dict[str, str]:
    """PyTorch state_dict name -> the parameter or buffer holding it, in the model's own state
    (lora.model_state: no adapters, int8 weights dequantized): a tied weight appears under
    each of its names, a non-persistent buffer under none."""
    stored_only = lora.names(signature.adapters) | {n for w in signature.quantized for n in (w.values, w.scale)}
    known = [s.name for s in signature.params + signature.buffers if s.name not in stored_only] + [
        w.weight for w in signature.quantized]
    if model is None:
        return {name: name for name in known}
    first_name: dict[int, str] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        first_name.setdefault(id(tensor), name)
    return {name: first_name[id(tensor)] for name, tensor in model.state_dict(keep_vars=True).items()
            if first_name.get(id(tensor)) in known}


def _manifest(program, *, model, model_file: str | None, loss, sparse) -> dict:
    sig, target, optimizer = program.signature, program.target, program.optimizer
    vmfb = program.vmfb  # compiled before the flags are read: a fallback in compiling changes them (program.fusion)
    policies = {p.name: sig.policies.get(p.name) for p in sig.params}
    abi = function_abi(sig)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model_file,
        "target": {"name": target.name, "description": target.description, "hal_device": target.hal_device,
                   "backend": target.backend, "drivers": list(target.drivers), "arch": target.arch,
                   "iree_compile_flags": program.iree_flags()},
        "versions": _versions(),
        # the workspace each function takes (pock_mlir/runtime/workspace.py)
        "module": {"file": MODULE, "workspace_bytes": {name: module_transient_bytes(vmfb, name) for name in abi},
                   "in_place": sorted(program.in_place)},
        "loss": _loss_name(loss),
        "optimizer": {"name": type(optimizer).__name__.lower(), **dataclasses.asdict(optimizer)},
        "sparse": {"scheme": program.scheme.source, "config": None if sparse is None else str(sparse),
                   "policies": {name: dataclasses.asdict(p) if p else {"kind": "full", "ratio": 1.0}
                                for name, p in policies.items()}},
        "lora": [adapter.to_json() for adapter in sig.adapters],
        "quantized": [weight.to_json() for weight in sig.quantized],
        "params": [p.to_json() for p in sig.params],
        "buffers": [b.to_json() for b in sig.buffers],
        "updated_buffers": list(sig.updated_buffers),
        "state_dict": _state_dict_sources(model, sig),
        "trainable": list(sig.trainable),
        "optimizer_state": [s.to_json() for s in sig.state],
        # the last by_keyword model inputs are the model's keyword arguments, named by keyword
        "batch": {"inputs": [i.to_json() for i in sig.inputs], "by_keyword": sig.by_keyword,
                  "target": sig.target.to_json(), "vocabularies": dict(sig.vocabularies)},
        "output": sig.output.to_json(),
        "functions": {name: {part: [{"path": path, **spec.to_json()} for path, spec in entries]
                             for part, entries in function.items()} for name, function in abi.items()},
        "files": {"parameters": PARAMS, "optimizer_state": OPTIMIZER, "arguments": ARGS + "/", "run_step": RUN_STEP},
        "sha256": {},  # every file of the bundle but this manifest, by relative path: filled once they are written
    }


def run_step_script(manifest: dict) -> str:
    """run_step.sh: one train_step with the stock iree-run-module, arguments from args/."""
    step = manifest["functions"]["train_step"]
    state_dirs = sorted({r["path"].split("/")[0] for r in step["results"] if "/" in r["path"]})
    inputs = "".join(f'  --input=@"$bundle/{ARGS}/{a["path"]}" \\\n' for a in step["arguments"])
    inputs += f'  --input="&{manifest["module"]["workspace_bytes"]["train_step"]}xi8" \\\n'
    outputs = " \\\n".join(f'  --output=@"$out/{r["path"]}"' for r in step["results"])
    target = manifest["target"]
    seed_note = "".join(f"\n# args/{a['path']} seeds the dropout masks: give each step another value (pock-train "
                        f"uses the step number)." for a in step["arguments"] if a["name"] == SEED_INPUT)
    return f"""#!/bin/sh
# One training step of this bundle (target {target['name']}: {target['description']}) with IREE's
# stock runtime; no Python needed.
#
#   ./run_step.sh [OUT_DIR]        (OUT_DIR defaults to ./out)
#
# Reads the train_step arguments from args/ next to this script: the parameters, buffers and
# optimizer state as compiled and a batch (args/batch/*.npy: replace them with your own data of
# the same shapes and dtypes, see manifest.json). Writes the loss and the updated state to
# OUT_DIR under the paths they have in args/, so that
#   cp -R {' '.join(f'OUT_DIR/{d}' for d in state_dirs)} args/
# makes the next run continue training from there. The last input is the workspace for the
# step's intermediate values (its size is recorded in the module; "&" leaves it uninitialised).{seed_note}
#
# IREE_RUN_MODULE: the iree-run-module command (default: the one on PATH), e.g. for an ARM module
#   on an x86 machine: "qemu-aarch64 -L /usr/aarch64-linux-gnu /path/to/aarch64/iree-run-module".
# IREE_DEVICE: the IREE driver (default {target['drivers'][0]}; this module runs on {', '.join(target['drivers'])}).
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
mkdir -p {' '.join(f'"$out/{d}"' for d in state_dirs)}
status=0
# $runtime is split into words on purpose: it may be a command with arguments.
$runtime \\
  --device="${{IREE_DEVICE:-{target['drivers'][0]}}}" \\
  --module="$bundle/{MODULE}" \\
  --function=train_step \\
{inputs}{outputs} || status=$?
if [ "$status" -ne 0 ]; then
  echo "run_step.sh: '$runtime' failed with exit code $status" >&2
  exit "$status"
fi
"""


BUNDLE_ENTRIES = (MANIFEST, MODULE, PARAMS, OPTIMIZER, ARGS, RUN_STEP)  # what write_bundle writes


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
        raise BundleError(f"{destination} exists and is not a pock bundle (no {MANIFEST} naming format "
                          f"'{FORMAT}'); choose another output directory")
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
    manifest["sha256"] = {str(f.relative_to(staged)): _sha256(f) for f in sorted(staged.rglob("*")) if f.is_file()}
    (staged / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _replace_directory(staged, destination)


def write_bundle(program, directory, *, example_inputs, example_target, loss, model=None, model_file=None,
                 sparse=None) -> Path:
    """Write `program` as a device bundle into `directory` (see the module docstring).

    example_inputs/example_target: the batch the program was compiled for, written to args/batch/
    so that run_step.sh runs as it is. model: the nn.Module compiled, whose state_dict layout (tied
    weights, non-persistent buffers) the manifest records for exporting trained weights; without
    it, the state_dict is the parameters and buffers. Nothing appears at `directory` unless the
    whole bundle was written."""
    destination = check_destination(directory)
    destination.parent.mkdir(parents=True, exist_ok=True)
    sig = program.signature
    manifest = _manifest(program, model=model, model_file=model_file, loss=loss, sparse=sparse)
    try:
        inputs = sig.flat_inputs(example_inputs)
    except ValueError as e:
        raise BundleError(f"the example batch: {e}") from None
    batch = {spec.name: _as_array(value, spec) for spec, value in zip(sig.model_inputs, inputs)}
    batch["target"] = _as_array(example_target, sig.target)
    if any(spec.name == SEED_INPUT for spec in sig.inputs):
        batch[SEED_INPUT] = np.zeros((), np.int32)  # the first step's dropout masks
    state = {**program.initial_params, **program.initial_buffers}
    optimizer_state = {s.name: np.zeros(s.shape, np.float32) for s in sig.state} | {"step": np.zeros((), np.float32)}

    with _staged_bundle(destination) as staged:
        (staged / MODULE).write_bytes(program.vmfb)
        (staged / PARAMS).write_bytes(save({n: np.require(v, requirements="C") for n, v in state.items()}))
        (staged / OPTIMIZER).write_bytes(save(optimizer_state))
        values = {"params": state, "buffers": state, "optimizer": optimizer_state, "batch": batch}
        for argument in manifest["functions"]["train_step"]["arguments"]:
            group, name = argument["path"].split("/", 1)
            path = staged / ARGS / argument["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, values[group][name.removesuffix(".npy")])
        (staged / RUN_STEP).write_text(run_step_script(manifest))
        (staged / RUN_STEP).chmod(0o755)
        _publish(staged, manifest, destination)
    return destination


@dataclass
class Bundle:
    """A bundle read back: what Trainer needs (signature, target, vmfb, initial state) and the manifest."""

    path: Path
    manifest: dict
    signature: StepSignature
    target: Target
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]

    @cached_property
    def vmfb(self) -> bytes:
        return (self.path / MODULE).read_bytes()

    @property
    def in_place(self) -> frozenset[str]:
        """See TrainingProgram.in_place (bundles written before it was recorded: the optimizer state
        where their `state_in_place` says so)."""
        module = self.manifest["module"]
        if "in_place" in module:
            return frozenset(module["in_place"])
        return frozenset({"optimizer"} if module.get("state_in_place") else ())

    @cached_property
    def modules(self) -> dict[tuple[str, ...], CompiledModule]:
        """Its one module, which holds every function the Trainer calls (TrainingProgram.modules):
        nothing is left to compile."""
        return {FUNCTIONS: CompiledModule(self.vmfb, FUNCTIONS, self.in_place)}

    @property
    def module_sha256(self) -> str:
        return self.manifest["sha256"][MODULE]

    def torch_state_dict(self, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Trainer.state_dict() in the layout the PyTorch model's load_state_dict expects, LoRA
        adapters merged into their weights, int8 weights dequantized."""
        state = lora.model_state(self.signature, state)
        return {name: state[source] for name, source in self.manifest["state_dict"].items()}

    @property
    def batch_size(self) -> int:
        return self.signature.target.shape[0] if self.signature.target.shape else 1


def _read_manifest(path: Path) -> dict:
    if not (path / MANIFEST).is_file():
        raise BundleError(f"{path} is not a pock bundle (no {MANIFEST}); write one with pock-compile")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path / MANIFEST} is not valid JSON ({e}); rewrite the bundle with pock-compile") from None
    except RecursionError:
        raise BundleError(f"{path / MANIFEST} nests too deep to be a manifest; rewrite the bundle with pock-compile") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path / MANIFEST} is not a pock bundle manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path} has bundle format version {manifest.get('format_version')}; this pock-mlir reads "
                          f"version {FORMAT_VERSION} (recompile with this pock-compile)")
    return manifest


def _load_tensors(path: Path, specs: list, what: str) -> dict[str, np.ndarray]:
    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise BundleError(f"cannot read the {what} in {path}: {e}") from None
    expected = {s.name: s for s in specs}
    if set(tensors) != set(expected):
        raise BundleError(f"{path} does not hold the {what} the manifest lists (missing: "
                          f"{', '.join(sorted(set(expected) - set(tensors))) or 'none'}; unexpected: "
                          f"{', '.join(sorted(set(tensors) - set(expected))) or 'none'})")
    for name, spec in expected.items():
        if tensors[name].shape != spec.shape or str(tensors[name].dtype) != spec.dtype:
            raise BundleError(f"{path}: {name} has shape {tensors[name].shape} and dtype {tensors[name].dtype}; "
                              f"the manifest says {spec.shape} and {spec.dtype}")
    return tensors


def _check_files(path: Path, manifest: dict) -> None:
    """Every file the bundle needs is listed with its sha256, is a regular file and matches:
    checked before anything is read or run."""
    hashes = manifest["sha256"]
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        raise BundleError(f"{path / MANIFEST}: sha256 must map file names to hashes")
    needed = {MODULE, PARAMS, OPTIMIZER, RUN_STEP} | {
        f"{ARGS}/{a['path']}" for a in manifest["functions"]["train_step"]["arguments"]}
    unlisted = sorted(needed - set(hashes))
    if unlisted:
        raise BundleError(f"{path / MANIFEST} lists no sha256 for {', '.join(unlisted)}; rewrite the bundle with pock-compile")
    for name, digest in sorted(hashes.items()):
        file = path / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise BundleError(f"{path / MANIFEST} names a file outside the bundle: {name}")
        if file.is_symlink() or not file.is_file():
            raise BundleError(f"{file} is missing or not a regular file; copy the whole bundle folder")
        if _sha256(file) != digest:
            raise BundleError(f"{file} is not the file the manifest describes (its sha256 differs): the bundle was "
                              f"modified or copied incompletely")


def _check_names(path: Path, signature: StepSignature) -> None:
    params, buffers = {p.name for p in signature.params}, {b.name for b in signature.buffers}
    problems = [f"trainable names {', '.join(sorted(set(signature.trainable) - params))}, not a parameter"
                if set(signature.trainable) - params else "",
                f"updated_buffers names {', '.join(sorted(set(signature.updated_buffers) - buffers))}, not a buffer"
                if set(signature.updated_buffers) - buffers else "",
                f"sparse policies name {', '.join(sorted(set(signature.policies) - params))}, not a parameter"
                if set(signature.policies) - params else "",
                "it lists no model input" if not signature.model_inputs else "",
                f"batch.by_keyword {signature.by_keyword!r} is not a count of its model inputs"
                if type(signature.by_keyword) is not int or not 0 <= signature.by_keyword <= len(signature.model_inputs)
                else "",
                "its vocabularies must map model inputs to positive sizes"
                if any(name not in {i.name for i in signature.model_inputs} or type(rows) is not int or rows < 1
                       for name, rows in signature.vocabularies.items()) else "",
                "its output has no shape" if not signature.output.shape else ""]
    expected_state = {}
    for name in signature.trainable:
        for spec in signature.state:
            if spec.name.startswith(name + "."):
                expected_state[spec.name] = signature.trainable_shape(name)
    problems += [f"optimizer state {s.name} belongs to no trainable parameter" for s in signature.state
                 if s.name not in expected_state]
    problems += [f"optimizer state {s.name} has shape {s.shape}, its parameter trains {expected_state[s.name]}"
                 for s in signature.state if s.name in expected_state and s.shape != tuple(expected_state[s.name])]
    shapes = {p.name: p.shape for p in signature.params}
    problems += [f"LoRA adapter {a.module} does not match its parameters' shapes" for a in signature.adapters
                 if (shapes.get(a.weight, a.weight_shape), shapes.get(a.a), shapes.get(a.b)) != (a.weight_shape, a.a_shape, a.b_shape)]
    problems += [f"int8 weight {w.module} does not match its parameters' shapes" for w in signature.quantized
                 if (shapes.get(w.values), shapes.get(w.scale)) != (w.weight_shape, (w.weight_shape[w.channel_axis],))]
    problems = [p for p in problems if p]
    if problems:
        raise BundleError(f"{path / MANIFEST} is inconsistent: {'; '.join(problems)}; rewrite the bundle with pock-compile")


def load_bundle(directory) -> Bundle:
    """Read and check a bundle; raises BundleError naming what is missing or inconsistent."""
    path = Path(directory)
    manifest = _read_manifest(path)
    try:
        spec = TensorSpec.from_json
        signature = StepSignature(
            params=[spec(p) for p in manifest["params"]], buffers=[spec(b) for b in manifest["buffers"]],
            updated_buffers=list(manifest["updated_buffers"]), trainable=list(manifest["trainable"]),
            state=[spec(s) for s in manifest["optimizer_state"]], inputs=[spec(i) for i in manifest["batch"]["inputs"]],
            target=spec(manifest["batch"]["target"]), output=spec(manifest["output"]),
            by_keyword=manifest["batch"]["by_keyword"],
            policies={name: Policy(**p) for name, p in manifest["sparse"]["policies"].items()},
            adapters=[lora.Adapter.from_json(entry) for entry in manifest["lora"]],
            quantized=[QuantizedWeight.from_json(entry) for entry in manifest["quantized"]],
            vocabularies=dict(manifest["batch"]["vocabularies"]))
        target = dataclasses.replace(resolve_target(manifest["target"]["name"]), arch=manifest["target"]["arch"])
        unknown_sources = set(manifest["state_dict"].values()) - {s.name for s in signature.params + signature.buffers} - {
            w.weight for w in signature.quantized}
        _check_files(path, manifest)
        _check_names(path, signature)
    except BundleError:
        raise
    except (KeyError, TypeError, AttributeError) as e:
        raise BundleError(f"{path / MANIFEST} lacks an entry or has one of the wrong kind ({e}); rewrite the bundle "
                          f"with pock-compile") from None
    except TargetError as e:
        raise BundleError(f"{path}: {e}") from None
    except ValueError as e:
        raise BundleError(f"{path / MANIFEST}: {e}; rewrite the bundle with pock-compile") from None
    if unknown_sources:
        raise BundleError(f"{path / MANIFEST}: its state_dict names tensors the module does not take: "
                          f"{', '.join(sorted(unknown_sources))}")
    state = _load_tensors(path / PARAMS, signature.params + signature.buffers, "parameters and buffers")
    optimizer_state = _load_tensors(path / OPTIMIZER, signature.state + [STEP], "optimizer state")
    return Bundle(path=path, manifest=manifest, signature=signature, target=target,
                  initial_params={p.name: state[p.name] for p in signature.params},
                  initial_buffers={b.name: state[b.name] for b in signature.buffers},
                  optimizer_state=optimizer_state)


def write_trained_bundle(bundle: Bundle, state: dict[str, np.ndarray], directory) -> Path:
    """A copy of `bundle` at `directory` that starts from `state` (a Trainer.state_dict(), e.g. a
    federation's global model) instead of the compiled weights: params.safetensors and args/
    rewritten, the hashes recomputed, the optimizer state as compiled. Staged and moved into place
    as write_bundle does, so nothing appears at `directory` unless the whole bundle was written."""
    destination = check_destination(directory)
    if destination.resolve() == bundle.path.resolve():
        raise BundleError(f"{destination} is the bundle being copied; give another directory")
    destination.parent.mkdir(parents=True, exist_ok=True)
    sig = bundle.signature
    names = [s.name for s in sig.params + sig.buffers]
    if sorted(state) != sorted(names):
        raise BundleError("the state to write does not hold exactly the bundle's parameters and buffers")
    manifest = json.loads(json.dumps(bundle.manifest))
    with _staged_bundle(destination) as staged:
        for name in manifest["sha256"]:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(bundle.path / name, staged / name)
        (staged / PARAMS).write_bytes(save({n: np.require(state[n], requirements="C") for n in names}))
        for argument in manifest["functions"]["train_step"]["arguments"]:
            group, name = argument["path"].split("/", 1)
            if group in ("params", "buffers"):
                np.save(staged / ARGS / argument["path"], state[name.removesuffix(".npy")])
        _publish(staged, manifest, destination)
    return destination
