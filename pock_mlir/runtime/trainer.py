"""Trainer: runs a compiled training program with parameters kept on the device.

The step functions are pure (parameters in, updated parameters out), so the trainer keeps
the device arrays each call returns and passes them to the next: nothing is copied back to
the host between steps.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import iree.runtime as rt
import numpy as np

from pock_mlir import lora
from pock_mlir.abi import (
    EVALUATE,
    EVALUATE_TRAIN,
    GRADIENTS,
    LOSS,
    LOSS_TRAIN,
    LOSS_VALUE,
    STEP_COUNT,
    TRAIN_STEP_INTO,
    TensorSpec,
    layout,
    runs,
)
from pock_mlir.runtime.artifact import TRAINER_MODULES, TrainingArtifact, trainer_module
from pock_mlir.runtime.bundle import Bundle, load_bundle
from pock_mlir.runtime.export import DEFAULT_MAX_SHARD_SIZE, ModelParams, Tensor, export_pretrained, model_tensors
from pock_mlir.runtime.memory import new_device, release_freed_memory, retain_freed_memory
from pock_mlir.runtime.onnx_export import write_onnx
from pock_mlir.runtime.workspace import BatchSlots, LossSlot, ModuleFunctions, Workspace, to_host

CALLED = tuple(f for module in TRAINER_MODULES for f in module)  # the module functions the Trainer calls


class InputError(ValueError):
    pass


class ModuleError(RuntimeError):
    """The compiled module cannot be loaded: corrupt, or not one this runtime runs."""


class NonFiniteLossError(ArithmeticError):
    """A step's loss was NaN or infinite; the module did not apply that step (Trainer.step)."""


IGNORE_INDEX = -100  # PyTorch's cross_entropy / nll_loss default: a target entry that counts for nothing
INT32 = np.iinfo(np.int32)
FEW_VALUES = 32  # up to this many, min and max of a list beat one numpy reduction (measured with numpy 2)


def _within(values: np.ndarray, low: int, high: int) -> bool:
    """Whether every integer of `values` lies in [low, high), as cheaply as every step's batch
    check needs: a few values as Python ints (a numpy reduction's fixed cost is larger), more in
    one reduction where low is 0 (read as unsigned, a negative value is beyond any high)."""
    if values.size <= FEW_VALUES:
        listed = values.ravel().tolist()
        return low <= min(listed) and max(listed) < high
    if low == 0:
        return bool(values.view(np.dtype(f"u{values.itemsize}")).max() < high)
    return bool(low <= values.min() and values.max() < high)


def check_class_indices(values: np.ndarray, classes: int | None, what: str) -> None:
    """Refuse, on the host, integer values the device would read out of bounds: beyond int32, or
    class indices outside [0, classes) other than IGNORE_INDEX. Names the array, index and value."""
    if values.dtype.kind not in "iu" or values.size == 0:
        return
    low, high = (0, classes) if classes is not None else (INT32.min, INT32.max + 1)
    if _within(values, low, high):
        return
    bad = ((values < low) | (values >= high)) & (values != IGNORE_INDEX)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        value = values[index]
        where = f"{what}[{', '.join(map(str, index))}]" if index else what
        if classes is None:
            raise InputError(f"{where} = {value} does not fit int32, which the device takes")
        raise InputError(
            f"{where} = {value} is not a class index: the model has {classes} classes "
            f"(indices 0..{classes - 1}, or {IGNORE_INDEX} to ignore an entry)"
        )


def check_token_ids(values: np.ndarray, vocabulary: int | None, what: str) -> None:
    """Refuse, on the host, token ids outside [0, vocabulary) (StepSignature.vocabularies: the
    embedding they index), as PyTorch's embedding does; the device would read out of bounds."""
    if vocabulary is None or values.dtype.kind not in "iu" or values.size == 0 or _within(values, 0, vocabulary):
        return
    low, high = int(values.min()), int(values.max())
    if high >= vocabulary or low < 0:
        which, value = ("largest", high) if high >= vocabulary else ("smallest", low)
        raise InputError(
            f"{what}: its {which} token id, {value}, is outside the vocabulary of the embedding it "
            f"indexes: {vocabulary} tokens (ids 0..{vocabulary - 1})"
        )


@dataclass(frozen=True)
class Expected:
    """A tensor as the device takes it, read off its TensorSpec once rather than in every step's
    batch check: numpy's dtype, the shape, and for int32 tensors (indices), the bounds of their
    values (check_class_indices, check_token_ids)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    indices: bool
    classes: int | None = None
    vocabulary: int | None = None

    @staticmethod
    def of(spec: TensorSpec, classes: int | None = None, vocabulary: int | None = None) -> Expected:
        dtype = np.dtype(spec.dtype)
        return Expected(spec.name, dtype, tuple(spec.shape), dtype == np.int32, classes, vocabulary)


def to_numpy(x) -> np.ndarray:
    """A numpy array of `x` (a torch tensor, an array or anything np.asarray takes), without importing torch."""
    if isinstance(x, np.ndarray):
        return x
    torch = sys.modules.get("torch")  # a torch tensor exists only where its caller imported torch
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class Trainer:
    def __init__(
        self,
        artifact: TrainingArtifact,
        device: str | None = None,
        retain_memory: bool = True,
        on_nonfinite: str = "raise",
    ):
        """artifact: what a TrainingProgram or a loaded bundle gives (program.trainer() and
        Trainer.from_bundle make one from either); device: an IREE driver
        (local-task, local-sync, vulkan, cuda), by default the one chosen for the program (on a
        CPU, local-sync for a step too small to share out between cores). retain_memory keeps
        the memory each step frees mapped for the next one (process-wide, glibc only; see
        pock_mlir/runtime/memory.py; the bench's "freed memory not retained" rows measure it,
        bench/results.md). on_nonfinite: what step() does when a loss is NaN or infinite (the
        module never applies such a step): "raise" NonFiniteLossError, or "skip" the batch,
        counted in skipped_steps."""
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
        self.on_nonfinite, self.skipped_steps = on_nonfinite, 0
        if retain_memory:
            retain_freed_memory()
        self.signature = artifact.signature
        self.device_name = device or artifact.driver
        artifact.target.check_runtime(self.device_name)
        # A device of the trainer's own, freed with it: a Vulkan device on Mesa's lavapipe keeps two
        # threads polling while it exists.
        self._config = rt.Config(device=new_device(self.device_name))
        # Only the modules and the compiler of the rest (a program's compiler(): not the program,
        # whose host copy of the initial values would live as long as the trainer): the host
        # copies of the initial values are not held once uploaded.
        self._modules, self._compile = artifact.modules, artifact.compile
        self.hf_files = artifact.hf_files  # config.json and generation_config.json, for export_pretrained
        self._workspace = Workspace(self._config.device)
        self._loaded: dict[str, ModuleFunctions] = {}  # by function: the loaded module that holds it
        sig = self.signature
        # Each function's arguments as the runs of roles pock_mlir.abi lays out: a call
        # concatenates the trainer's per-role lists in that order.
        self._roles = {name: [role for role, _ in runs(layout(sig, name)[0])] for name in CALLED}
        # what every call's batch check compares with (the signature computes its lists anew on each access)
        self._model_inputs = [Expected.of(s, vocabulary=sig.vocabularies.get(s.name)) for s in sig.model_inputs]
        self._target = [Expected.of(sig.target, sig.target_classes, sig.vocabularies.get(sig.target.name))]
        self._seeded = sig.seeded
        self._slots = BatchSlots(self._config.device, sig.batch)
        self._loss = LossSlot(self._config.device, LOSS_VALUE)  # where each step writes its loss
        # train_step_into's argument lists by the step counter they pass (two alternate, see step):
        # where the batch's buffers are the same every step (BatchSlots), so are a step's
        # arguments but for that alternation, until something replaces the arrays held
        self._step_arguments: dict[int, rt.VmVariantList] = {}
        self._params = {p.name: self._put(artifact.initial_params[p.name]) for p in sig.params}
        self._buffers = {b.name: self._put(artifact.initial_buffers[b.name]) for b in sig.buffers}
        self._state = [self._put(np.zeros(s.shape, np.float32)) for s in sig.state]
        self._step = self._put(np.zeros((), np.float32))
        # What the next step writes its new values into (see passes/pock_step_into.py), by role:
        # where the step's compiled schedule allows it (its module's in_place, known once that is
        # loaded), the buffers it reads, which it overwrites where they are; else a spare set, and
        # what a step replaces becomes the step after's, so no call reads and writes one buffer.
        self._in_place: frozenset[str] | None = None
        self._spare: dict[str, list] = {}
        self._spare_step = self._put(np.zeros((), np.float32))
        self.seed = 0  # the dropout seed of the next call; step() increments it
        self._functions_for(TRAIN_STEP_INTO, compile=False)  # what is compiled already loads now
        release_freed_memory()  # the host arrays set-up allocated and dropped

    def _functions_for(self, function: str, compile: bool = True) -> ModuleFunctions | None:
        """The loaded module that holds `function`: else one the program has compiled, loaded;
        else (unless compile is False) its TRAINER_MODULES group, compiled now and loaded."""
        loaded = self._loaded.get(function)  # a step looks its module up here: a dict, not a search
        if loaded is not None:
            return loaded
        compiled = next((m for m in self._modules.values() if function in m.functions), None)
        if compiled is None:
            if not compile:
                return None
            compiled = self._compile(trainer_module(function))
        context = rt.SystemContext(config=self._config)  # one per module: each is named "module"
        try:
            context.add_vm_module(compiled.load(self._config.vm_instance))
            loaded = ModuleFunctions(
                context, self._config.device, tuple(f for f in CALLED if f in compiled.functions), self._workspace
            )
        except (RuntimeError, ValueError, IndexError, KeyError, TypeError) as e:
            raise ModuleError(
                f"the module is corrupt or was not compiled by this pock-mlir for {self.device_name} "
                f"(IREE: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__}); "
                f"recompile it"
            ) from None
        self._loaded.update(dict.fromkeys(loaded.names, loaded))
        if TRAIN_STEP_INTO in compiled.functions:
            written = self.signature.written()
            self._in_place = compiled.in_place & set(written)
            self._spare = {
                role: [self._put(np.zeros(spec.shape, spec.dtype)) for spec in specs]
                for role, specs in written.items()
                if role not in self._in_place
            }
        return loaded

    @classmethod
    def from_bundle(cls, bundle, device: str | None = None, on_nonfinite: str = "raise") -> Trainer:
        """A trainer for a device bundle (its path, or a loaded pock_mlir.runtime.bundle.Bundle) starting
        from the bundle's parameters and optimizer state; raises BundleError or TargetError when it cannot run here."""
        loaded_here = not isinstance(bundle, Bundle)
        if loaded_here:
            bundle = load_bundle(bundle)
        trainer = cls(bundle.artifact(), device, on_nonfinite=on_nonfinite)
        trainer.load_optimizer_state(bundle.optimizer_state)
        if loaded_here:  # its host copies of the parameters and optimizer state are on the device now
            del bundle
            release_freed_memory()
        return trainer

    @property
    def in_place(self) -> frozenset[str]:
        """What each step overwrites where it is (one copy on the device) rather than writing it into
        a second set, by role: params (the trained ones), optimizer (its state), buffers (those the
        forward updates); see pock_mlir/in_place.py."""
        self._functions_for(TRAIN_STEP_INTO)
        return self._in_place

    @property
    def device_bytes(self) -> int:
        """The device memory the trainer holds: parameters, buffers, optimizer state, the second
        set of what each step writes where it is not written in place (see __init__), the batch
        and the workspace (see workspace_bytes)."""
        self._functions_for(TRAIN_STEP_INTO)
        return self.signature.device_bytes(self._in_place, self._workspace.bytes)

    @property
    def workspace_bytes(self) -> int | None:
        """The device memory every call shares for its intermediate values (see
        pock_mlir/runtime/workspace.py), the largest the step's module and any other loaded so far
        need (gradients has a module of its own, loaded when first called); None for modules
        compiled without a workspace."""
        self._functions_for(TRAIN_STEP_INTO)
        return self._workspace.bytes

    # -- data movement --------------------------------------------------------------------

    def _put(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            array = np.require(array, requirements="C")  # keeps rank 0, unlike ascontiguousarray
        return rt.asdevicearray(self._config.device, array)

    def _host(self, array) -> np.ndarray:
        return to_host(self._config.device, array)

    def _check(self, values, specs: list[TensorSpec]) -> list:
        """Device arrays of state tensors `values` for `specs` (not a batch), checked (see _checked)
        and uploaded."""
        return [self._put(v) for v in self._checked(values, [Expected.of(s) for s in specs], batch=False)]

    def _checked(self, values, expected: list[Expected], batch: bool = True) -> list[np.ndarray]:
        """Host arrays as `expected`, checked. float64 becomes float32 and int64 int32
        (numpy's and torch's defaults); anything else that differs is an InputError naming the
        tensor and what differs, before anything is uploaded."""
        if len(values) != len(expected):
            raise InputError(
                f"expected {len(expected)} input tensor(s) ({', '.join(e.name for e in expected)}), got {len(values)}"
            )
        checked = []
        for v, want in zip(values, expected):
            v = to_numpy(v)
            if want.indices and v.dtype.kind in "iu":
                check_class_indices(v, want.classes, want.name)
                check_token_ids(v, want.vocabulary, want.name)
                v = v.astype(np.int32, copy=False)  # the device takes int32 indices
            elif v.dtype != want.dtype:
                if v.dtype != np.float64 or want.dtype != np.float32:
                    raise InputError(f"{want.name}: expected dtype {want.dtype}, got {v.dtype}")
                v = v.astype(np.float32)
            if v.shape != want.shape:
                hint = (
                    "; the program was compiled for the example batch's shape (recompile for another batch size)"
                    if batch
                    else ""
                )
                raise InputError(f"{want.name}: expected shape {want.shape}, got {v.shape}{hint}")
            checked.append(v)
        return checked

    def _on_device(self, values: list[np.ndarray]) -> list:
        """Checked batch tensors (a prefix of signature.batch, as the slots), on the device."""
        if self._slots.arrays is None:
            return [self._put(v) for v in values]
        return [self._slots.write(i, v) for i, v in enumerate(values)]

    def _host_inputs(self, inputs) -> list[np.ndarray]:
        try:
            flat = self.signature.flat_inputs(inputs)
        except ValueError as e:
            raise InputError(str(e)) from None
        checked = self._checked(flat, self._model_inputs)
        if self._seeded:
            checked.append(np.array(self.seed & 0xFFFFFFFF, np.uint32).view(np.int32))
        return checked

    def _inputs(self, inputs):
        return self._on_device(self._host_inputs(inputs))

    def _batch(self, inputs, target):
        return self._on_device(self._host_inputs(inputs) + self._checked((target,), self._target))

    def _arguments(self, function: str, **by_role) -> list:
        """`function`'s arguments: the trainer's parameters and buffers and the lists given by role."""
        by_role.setdefault("params", self._params.values())
        by_role.setdefault("buffers", self._buffers.values())  # no run of them when the model has none
        arguments = []
        for role in self._roles[function]:
            arguments.extend(by_role[role])
        return arguments

    def _call(self, function: str, **by_role) -> list:
        """Call `function` with the trainer's parameters and buffers and the lists given by role."""
        return self._functions_for(function)(function, *self._arguments(function, **by_role))

    # -- the API ---------------------------------------------------------------------------

    def step(self, inputs, target) -> float:
        """One optimizer update; returns the loss before the update. inputs, here as in gradients,
        loss and evaluate: as the model was called when compiled, a tensor, a tuple of them, a dict
        of keyword inputs (`model(**batch)`), or a tuple ending in such a dict (pock_mlir.abi.split_call),
        with the same keys (a None value counts as absent). Dropout masks come from
        `self.seed`, which then increments, so every step draws fresh masks. A NaN or infinite
        loss leaves parameters, buffers and optimizer state as they were and raises
        NonFiniteLossError (or, with on_nonfinite="skip", counts the batch in skipped_steps)."""
        functions = self._functions_for(TRAIN_STEP_INTO)  # which sets _in_place and _spare
        sig, spare = self.signature, self._spare
        params = [self._params[name] for name in sig.trainable]
        buffers = [self._buffers[name] for name in sig.updated_buffers]
        into_params, into_state = spare.get("params", params), spare.get("optimizer", self._state)
        into_buffers = spare.get("buffers", buffers)
        batch = self._batch(inputs, target)
        arguments = self._step_arguments.get(id(self._step))
        if arguments is None:
            step_arrays = self._arguments(
                TRAIN_STEP_INTO,
                optimizer=[*self._state, self._step],
                batch=batch,
                loss=[self._loss.array],
                into=[*into_params, *into_state, *into_buffers, self._spare_step],
            )
            arguments = functions.arguments(TRAIN_STEP_INTO, step_arrays)
            if self._slots.arrays is not None:
                self._step_arguments[id(self._step)] = arguments
        functions.invoke(TRAIN_STEP_INTO, arguments)
        # a step that raised above changed nothing here (what it writes in place aside)
        for role, old in (("params", params), ("optimizer", self._state), ("buffers", buffers)):
            if role in spare:
                spare[role] = old
        self._params.update(zip(sig.trainable, into_params))
        self._state = into_state
        self._buffers.update(zip(sig.updated_buffers, into_buffers))
        self._step, self._spare_step = self._spare_step, self._step
        self.seed += 1
        value = self._loss.read()
        if not math.isfinite(value):
            if self.on_nonfinite == "raise":
                raise NonFiniteLossError(
                    f"the loss is {value} on this batch; the step was not applied (look for "
                    f"NaN or inf in the batch, or lower the learning rate)"
                )
            self.skipped_steps += 1
        return value

    def gradients(self, inputs, target, names=None) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the gradients of the trainable parameters, without updating them; `names`:
        copy only these gradients to the host (all by default)."""
        unknown = sorted(set(names or ()) - set(self.signature.trainable))
        if unknown:
            raise InputError(
                f"no gradient for {', '.join(unknown)}: trainable are {', '.join(self.signature.trainable)}"
            )
        results = self._call(GRADIENTS, batch=self._batch(inputs, target))
        grads = {
            name: self._host(g)
            for name, g in zip(self.signature.trainable, results[1:])
            if names is None or name in names
        }
        return float(self._host(results[0])), grads

    def loss(self, inputs, target, train_mode: bool = False) -> float:
        """The loss on a batch, without updating anything (for validation): the forward pass only,
        as the model in eval mode computes it (see evaluate), or with train_mode=True as a step does."""
        function = LOSS_TRAIN if train_mode else LOSS
        return float(self._host(self._call(function, batch=self._batch(inputs, target))[0]))

    def evaluate(self, inputs, train_mode: bool = False) -> np.ndarray:
        """The model's output for a batch of the compiled shape, as the PyTorch model in eval mode
        gives it (`model.eval()`: dropout off, BatchNorm on its running statistics). train_mode=True:
        in the mode the model was compiled in, as a step computes it (a model in training mode
        applies dropout, with `self.seed`)."""
        function = EVALUATE_TRAIN if train_mode else EVALUATE
        return self._host(self._call(function, batch=self._inputs(inputs))[0])

    def _held(self) -> dict[str, np.ndarray]:
        """Every parameter and buffer by its name in the signature, copied to the host."""
        return {name: self._host(v) for name, v in (*self._params.items(), *self._buffers.items())}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and buffers under the model's state_dict keys (as PyTorch's state_dict: a tied
        weight under each of its keys, no non-persistent buffer), then any LoRA adapters and int8
        weights by name, copied to the host."""
        return self.signature.keyed_state(self._held())

    def state_tensors(self) -> list[Tensor]:
        """state_dict()'s entries, each copied to the host only when its value() is called: for
        writers that stream them one at a time (pock_mlir/checkpoint.py)."""
        return [
            Tensor(key, s.dtype, s.shape, partial(self._fetch, s.name)) for key, s in self.signature.keyed_specs.items()
        ]

    def merged_state_dict(self) -> dict[str, np.ndarray]:
        """The PyTorch model's state_dict, exactly its keys: LoRA adapters merged into their base
        weights (PEFT's merge_and_unload), int8 weights dequantized."""
        return lora.torch_state_dict(self.signature, self._held())

    def merged_state_tensors(self) -> list[Tensor]:
        """merged_state_dict()'s entries as state_tensors() gives state_dict()'s, each merged or
        dequantized when fetched."""
        return model_tensors(self.signature, self._fetch, merge=True)

    def _fetch(self, name: str) -> np.ndarray:
        """One parameter or buffer, copied to the host."""
        return self._host(self._params[name] if name in self._params else self._buffers[name])

    def export_adapters(self, directory) -> Path:
        """Write the LoRA adapters (and any other module the scheme trains, as PEFT's
        modules_to_save) as adapter_model.safetensors and adapter_config.json into `directory`,
        which `peft.PeftModel.from_pretrained(model, directory)` loads onto the original model."""
        tensors, config = lora.peft_adapter(
            ModelParams(self.signature, self._fetch), self.signature.adapters, self.signature.trainable
        )
        return lora.write_peft_adapter(directory, tensors, config)

    def export_pretrained(self, directory, *, lora: str = "merge", max_shard_size=DEFAULT_MAX_SHARD_SIZE) -> Path:
        """Write the tuned model as a Hugging Face model directory that
        `transformers.AutoModelForCausalLM.from_pretrained(directory)` (or the model's Auto class)
        loads: config.json and generation_config.json as compiled, the state_dict in safetensors
        files of at most max_shard_size (bytes, or "5GB", "500MB"; with model.safetensors.index.json
        when there are several), int8 weights dequantized. lora="merge" merges LoRA adapters into
        their weights; lora="peft" writes the base weights unmerged and the adapters as PEFT's
        adapter_model.safetensors and adapter_config.json beside them (see
        pock_mlir/runtime/export.py). The weights stream from the device one tensor at a time;
        `directory` must be new, empty or an earlier export, which it replaces atomically."""
        return export_pretrained(
            directory, self.signature, self._fetch, self.hf_files, mode=lora, max_shard_size=max_shard_size
        )

    def export_onnx(self, path, source) -> Path:
        """Write the ONNX model `source` (the .onnx path or onnx.ModelProto the program was compiled
        from) to `path` with the trained parameters and buffers as its initializers: an inference
        model for ONNX Runtime (needs the onnx package; pock_mlir/runtime/onnx_export.py)."""
        return write_onnx(path, source, self._held())

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Replace parameters and buffers by state_dict key (the keys state_dict() returns). strict
        (as in PyTorch): every key must be given; strict=False loads a subset. The keys of one tied
        weight must hold one value. Everything is checked before anything changes."""
        specs, keys_of = self.signature.keyed_specs, self.signature.keys_of()
        unknown, missing = sorted(set(state) - set(specs)), sorted(set(specs) - set(state))
        if unknown:
            hidden = [n for n in unknown if n in keys_of]
            why = (
                f" ({', '.join(hidden)}: not in the model's state_dict, a non-persistent buffer, which keeps its "
                f"compiled value)"
                if hidden
                else ""
            )
            raise InputError(f"unknown state_dict entries: {', '.join(unknown)}{why}")
        if strict and missing:
            raise InputError(
                f"state_dict lacks {', '.join(missing)} (load_state_dict(state, strict=False) loads a subset)"
            )
        given = {name: [key for key in keys if key in state] for name, keys in keys_of.items()}
        given = {name: keys for name, keys in given.items() if keys}
        names = sorted(given)
        for name in names:
            first, *others = given[name]
            differing = [key for key in others if not np.array_equal(to_numpy(state[key]), to_numpy(state[first]))]
            if differing:
                raise InputError(
                    f"{first} and {', '.join(differing)} are one tied weight of the model but hold "
                    f"different values; give them one value"
                )
        arrays = self._check([state[given[n][0]] for n in names], [specs[given[n][0]] for n in names])
        for name, array in zip(names, arrays):
            (self._params if name in self._params else self._buffers)[name] = array
        self._step_arguments.clear()
        release_freed_memory()  # the arrays replaced

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state by "<param>.<slot>" name and "step" (the steps taken, a float32
        scalar), copied to the host: with state_dict(), everything a checkpoint needs."""
        state = {spec.name: self._host(value) for spec, value in zip(self.signature.state, self._state)}
        state["step"] = self._host(self._step)
        return state

    def optimizer_tensors(self) -> list[Tensor]:
        """optimizer_state()'s entries as state_tensors() gives state_dict()'s."""
        specs, values = [*self.signature.state, STEP_COUNT], [*self._state, self._step]
        return [Tensor(s.name, s.dtype, s.shape, partial(self._host, v)) for s, v in zip(specs, values)]

    def load_optimizer_state(self, state: dict) -> None:
        """Replace the whole optimizer state (the entries optimizer_state() returns)."""
        names = [spec.name for spec in self.signature.state] + ["step"]
        missing, unknown = sorted(set(names) - set(state)), sorted(set(state) - set(names))
        if missing or unknown:
            raise InputError(
                f"optimizer state: missing {', '.join(missing) or 'nothing'}; unknown {', '.join(unknown) or 'nothing'}"
            )
        step = to_numpy(state["step"])
        if step.shape != () or step.dtype != np.float32 or not (np.isfinite(step) and step >= 0 and step == int(step)):
            raise InputError(
                f"optimizer state: step must be a float32 scalar counting steps (a whole number >= 0), got {step!r}"
            )
        slots = self._check([state[spec.name] for spec in self.signature.state], self.signature.state)
        self._state, self._step = slots, self._put(step)
        self._step_arguments.clear()
        release_freed_memory()  # the state replaced

    @property
    def steps_taken(self) -> int:
        return int(self._host(self._step))
