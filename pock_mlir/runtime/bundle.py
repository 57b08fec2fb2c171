"""Device bundles: one folder with everything a device needs to train, without PyTorch.

    bundle/
      manifest.json          parameters, buffers, optimizer state, batch, sparse scheme, target, versions
      module.vmfb            the IREE module: its functions as pock_mlir/abi.py lays them out
      functions.json         each function's arguments and results (name, shape, dtype, file), for
                             iree-run-module users; the Trainer reads the layout from pock_mlir/abi.py
      params.safetensors     the model's state_dict as compiled (parameters and buffers)
      optimizer.safetensors  the optimizer state ("<param>.<slot>") and "step"
      args/                  one .npy per train_step argument, for iree-run-module --input=@FILE
      run_step.sh            one training step with the stock iree-run-module
      hf/                    a transformers model's config.json and generation_config.json (the
                             manifest's "hf_files"), for Trainer.export_pretrained

The module takes the parameters as arguments (it reads no parameter archive), so args/ holds
them in the form iree-run-module reads; args/batch/ holds the example batch the module was
compiled for. Loading a bundle (`load_bundle`, `Trainer.from_bundle`) needs numpy, safetensors
and iree.runtime only; pock_mlir/bundle.py writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from pock_mlir import lora
from pock_mlir.abi import FUNCTIONS, STEP_COUNT, TRAIN_STEP, Policy, StepSignature, TensorSpec, layout
from pock_mlir.quantize import QuantizedWeight
from pock_mlir.runtime.artifact import CompiledModule, TrainingArtifact
from pock_mlir.runtime.export import HF_FILES
from pock_mlir.targets import Target, TargetError, resolve_target

FORMAT = "pock-bundle"
# 2: the module has a `loss` function; 3: every file's sha256; 4: LoRA adapters, int8 weights; 5: keyword
# inputs, loss and evaluate in eval mode beside loss_train and evaluate_train; 6: int4 weights (each
# quantized weight's format, group and tied heads); 7: the driver chosen for the program; 8: train_step_into
# writes its loss into a buffer it is passed; 9: the functions' arguments and results in functions.json (a
# Trainer needs none of it, and parsing it held 0.43 MB resident of MobileNetV3's deployed process)
FORMAT_VERSION = 9
MANIFEST, MODULE, FUNCTIONS_JSON, PARAMS, OPTIMIZER, ARGS, RUN_STEP = (
    "manifest.json",
    "module.vmfb",
    "functions.json",
    "params.safetensors",
    "optimizer.safetensors",
    "args",
    "run_step.sh",
)
HF = "hf"  # the directory of the model's Hugging Face files (bundles before it have none)


class BundleError(ValueError):
    pass


# Hashed through one buffer below glibc's mmap threshold (128 KiB): reading 1 MiB chunks raised the
# threshold (glibc does so when a mapped block is freed), and what the Trainer then allocated stayed
# on the heap: MobileNetV3's deployed process held 0.95 MB more after loading its bundle.
HASH_BUFFER = 1 << 16


def file_sha256(path: Path) -> str:
    digest, buffer = hashlib.sha256(), bytearray(HASH_BUFFER)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while read := f.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


@dataclass
class Bundle:
    """A bundle read back: what Trainer needs (artifact(), and the optimizer state) and the manifest."""

    path: Path
    manifest: dict
    signature: StepSignature
    target: Target
    initial_params: dict[str, np.ndarray]
    initial_buffers: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    driver: str  # see TrainingArtifact
    hf_files: dict[str, dict] = dataclasses.field(default_factory=dict)  # see TrainingArtifact

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

    def artifact(self) -> TrainingArtifact:
        """What a Trainer runs: its one module, which holds every function the Trainer calls
        (nothing is left to compile), and the parameters and buffers it holds."""
        module = CompiledModule((self.path / MODULE).absolute(), FUNCTIONS, self.in_place)  # mapped when loaded
        return TrainingArtifact(
            self.signature,
            self.target,
            {FUNCTIONS: module},
            self.initial_params,
            self.initial_buffers,
            self.driver,
            hf_files=self.hf_files,
        )

    @property
    def module_sha256(self) -> str:
        return self.manifest["sha256"][MODULE]

    @property
    def step_argument_files(self) -> list[str]:
        """train_step's argument files, in order, relative to the bundle's args/."""
        return step_argument_files(self.signature)

    @property
    def batch_size(self) -> int:
        return self.signature.target.shape[0] if self.signature.target.shape else 1


def step_argument_files(signature: StepSignature) -> list[str]:
    return [slot.path for slot in layout(signature, TRAIN_STEP)[0]]


def _read_manifest(path: Path) -> dict:
    if not (path / MANIFEST).is_file():
        raise BundleError(f"{path} is not a pock bundle (no {MANIFEST}); write one with pock-compile")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{path / MANIFEST} is not valid JSON ({e}); rewrite the bundle with pock-compile") from None
    except RecursionError:
        raise BundleError(
            f"{path / MANIFEST} nests too deep to be a manifest; rewrite the bundle with pock-compile"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path / MANIFEST} is not a pock bundle manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{path} has bundle format version {manifest.get('format_version')}; this pock-mlir reads "
            f"version {FORMAT_VERSION} (recompile with this pock-compile)"
        )
    return manifest


def _load_tensors(path: Path, specs: list, what: str) -> dict[str, np.ndarray]:
    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as e:
        raise BundleError(f"cannot read the {what} in {path}: {e}") from None
    expected = {s.name: s for s in specs}
    if set(tensors) != set(expected):
        raise BundleError(
            f"{path} does not hold the {what} the manifest lists (missing: "
            f"{', '.join(sorted(set(expected) - set(tensors))) or 'none'}; unexpected: "
            f"{', '.join(sorted(set(tensors) - set(expected))) or 'none'})"
        )
    for name, spec in expected.items():
        if tensors[name].shape != spec.shape or str(tensors[name].dtype) != spec.dtype:
            raise BundleError(
                f"{path}: {name} has shape {tensors[name].shape} and dtype {tensors[name].dtype}; "
                f"the manifest says {spec.shape} and {spec.dtype}"
            )
    return tensors


def _check_files(path: Path, manifest: dict, signature: StepSignature) -> None:
    """Every file the bundle needs is listed with its sha256, is a regular file and matches:
    checked before anything is read or run."""
    hashes = manifest["sha256"]
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        raise BundleError(f"{path / MANIFEST}: sha256 must map file names to hashes")
    needed = {MODULE, FUNCTIONS_JSON, PARAMS, OPTIMIZER, RUN_STEP} | {
        f"{ARGS}/{file}" for file in step_argument_files(signature)
    }
    unlisted = sorted(needed - set(hashes))
    if unlisted:
        raise BundleError(
            f"{path / MANIFEST} lists no sha256 for {', '.join(unlisted)}; rewrite the bundle with pock-compile"
        )
    for name, digest in sorted(hashes.items()):
        file = path / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise BundleError(f"{path / MANIFEST} names a file outside the bundle: {name}")
        if file.is_symlink() or not file.is_file():
            raise BundleError(f"{file} is missing or not a regular file; copy the whole bundle folder")
        if file_sha256(file) != digest:
            raise BundleError(
                f"{file} is not the file the manifest describes (its sha256 differs): the bundle was "
                f"modified or copied incompletely"
            )


def _check_names(path: Path, signature: StepSignature) -> None:
    params, buffers = {p.name for p in signature.params}, {b.name for b in signature.buffers}
    problems = [
        f"trainable names {', '.join(sorted(set(signature.trainable) - params))}, not a parameter"
        if set(signature.trainable) - params
        else "",
        f"updated_buffers names {', '.join(sorted(set(signature.updated_buffers) - buffers))}, not a buffer"
        if set(signature.updated_buffers) - buffers
        else "",
        f"sparse policies name {', '.join(sorted(set(signature.policies) - params))}, not a parameter"
        if set(signature.policies) - params
        else "",
        "it lists no model input" if not signature.model_inputs else "",
        f"batch.by_keyword {signature.by_keyword!r} is not a count of its model inputs"
        if type(signature.by_keyword) is not int or not 0 <= signature.by_keyword <= len(signature.model_inputs)
        else "",
        "its vocabularies must map model inputs to positive sizes"
        if any(
            name not in {i.name for i in signature.model_inputs} or type(rows) is not int or rows < 1
            for name, rows in signature.vocabularies.items()
        )
        else "",
        "its output has no shape" if not signature.output.shape else "",
    ]
    expected_state = {}
    for name in signature.trainable:
        for spec in signature.state:
            if spec.name.startswith(name + "."):
                expected_state[spec.name] = signature.trainable_shape(name)
    problems += [
        f"optimizer state {s.name} belongs to no trainable parameter"
        for s in signature.state
        if s.name not in expected_state
    ]
    problems += [
        f"optimizer state {s.name} has shape {s.shape}, its parameter trains {expected_state[s.name]}"
        for s in signature.state
        if s.name in expected_state and s.shape != tuple(expected_state[s.name])
    ]
    shapes = {p.name: p.shape for p in signature.params}
    problems += [
        f"LoRA adapter {a.module} does not match its parameters' shapes"
        for a in signature.adapters
        if (shapes.get(a.weight, a.weight_shape), shapes.get(a.a), shapes.get(a.b))
        != (a.weight_shape, a.a_shape, a.b_shape)
    ]
    problems += [
        f"{w.format} weight {w.module} does not match its parameters' shapes"
        for w in signature.quantized
        if (shapes.get(w.values), shapes.get(w.scale)) != w.stored_shapes
    ]
    problems = [p for p in problems if p]
    if problems:
        raise BundleError(
            f"{path / MANIFEST} is inconsistent: {'; '.join(problems)}; rewrite the bundle with pock-compile"
        )


def _load_hf_files(path: Path, manifest: dict) -> dict[str, dict]:
    """The Hugging Face files the manifest lists (already checked against their sha256)."""
    names = manifest.get("hf_files", [])
    if not isinstance(names, list) or not set(names) <= set(HF_FILES):
        raise BundleError(f"{path / MANIFEST}: hf_files must list some of {', '.join(HF_FILES)}")
    unlisted = [name for name in names if f"{HF}/{name}" not in manifest["sha256"]]
    if unlisted:
        raise BundleError(f"{path / MANIFEST} lists no sha256 for {', '.join(f'{HF}/{n}' for n in unlisted)}")
    files = {}
    for name in names:
        try:
            files[name] = json.loads((path / HF / name).read_text())
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise BundleError(
                f"{path / HF / name} is not valid JSON ({e}); rewrite the bundle with pock-compile"
            ) from None
        if not isinstance(files[name], dict):
            raise BundleError(f"{path / HF / name} is not a JSON object; rewrite the bundle with pock-compile")
    return files


def load_bundle(directory) -> Bundle:
    """Read and check a bundle; raises BundleError naming what is missing or inconsistent."""
    path = Path(directory)
    manifest = _read_manifest(path)
    try:
        spec = TensorSpec.from_json
        signature = StepSignature(
            params=[spec(p) for p in manifest["params"]],
            buffers=[spec(b) for b in manifest["buffers"]],
            updated_buffers=list(manifest["updated_buffers"]),
            trainable=list(manifest["trainable"]),
            state=[spec(s) for s in manifest["optimizer_state"]],
            inputs=[spec(i) for i in manifest["batch"]["inputs"]],
            target=spec(manifest["batch"]["target"]),
            output=spec(manifest["output"]),
            by_keyword=manifest["batch"]["by_keyword"],
            policies={name: Policy(**p) for name, p in manifest["sparse"]["policies"].items()},
            adapters=[lora.Adapter.from_json(entry) for entry in manifest["lora"]],
            quantized=[QuantizedWeight.from_json(entry) for entry in manifest["quantized"]],
            vocabularies=dict(manifest["batch"]["vocabularies"]),
            state_dict=dict(manifest["state_dict"]),
        )
        target = dataclasses.replace(resolve_target(manifest["target"]["name"]), arch=manifest["target"]["arch"])
        driver = manifest["target"]["driver"]
        if driver not in target.drivers:
            raise BundleError(
                f"{path / MANIFEST}: its driver '{driver}' is not one of target '{target.name}' "
                f"({', '.join(target.drivers)}); rewrite the bundle with pock-compile"
            )
        unknown_sources = (
            set(manifest["state_dict"].values())
            - {s.name for s in signature.params + signature.buffers}
            - {w.weight for w in signature.quantized}
        )
        _check_names(path, signature)
        _check_files(path, manifest, signature)
        hf_files = _load_hf_files(path, manifest)
    except BundleError:
        raise
    except (KeyError, TypeError, AttributeError) as e:
        raise BundleError(
            f"{path / MANIFEST} lacks an entry or has one of the wrong kind ({e}); rewrite the bundle with pock-compile"
        ) from None
    except TargetError as e:
        raise BundleError(f"{path}: {e}") from None
    except ValueError as e:
        raise BundleError(f"{path / MANIFEST}: {e}; rewrite the bundle with pock-compile") from None
    if unknown_sources:
        raise BundleError(
            f"{path / MANIFEST}: its state_dict names tensors the module does not take: "
            f"{', '.join(sorted(unknown_sources))}"
        )
    state = _load_tensors(path / PARAMS, signature.params + signature.buffers, "parameters and buffers")
    optimizer_state = _load_tensors(path / OPTIMIZER, signature.state + [STEP_COUNT], "optimizer state")
    return Bundle(
        path=path,
        manifest=manifest,
        signature=signature,
        target=target,
        initial_params={p.name: state[p.name] for p in signature.params},
        initial_buffers={b.name: state[b.name] for b in signature.buffers},
        optimizer_state=optimizer_state,
        hf_files=hf_files,
        driver=driver,
    )
