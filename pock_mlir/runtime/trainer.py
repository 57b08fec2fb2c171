"""Trainer: runs a compiled training program with parameters kept on the device.

The step functions are pure (parameters in, updated parameters out), so the trainer keeps
the device arrays each call returns and passes them to the next: nothing is copied back to
the host between steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import iree.runtime as rt

if TYPE_CHECKING:  # the runtime runs on devices without PyTorch, which the frontend imports
    from pock_mlir.frontend import TensorSpec


# A model with dropout in training mode takes the seed of its masks as its last input, after
# the model's own (see pock_mlir/dropout.py); the trainer supplies it.
SEED_INPUT = "seed"


class InputError(ValueError):
    pass


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
    except ImportError:
        pass
    return np.asarray(x)


def _as_tuple(inputs):
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


class Trainer:
    def __init__(self, program, device: str | None = None):
        self.signature = program.signature
        self.device_name = device or program.target.device
        self._config = rt.Config(self.device_name)
        self._context = rt.SystemContext(config=self._config)
        self._context.add_vm_module(rt.VmModule.copy_buffer(self._config.vm_instance, program.vmfb))
        module = self._context.modules.module
        self._train_step, self._gradients, self._evaluate = module["train_step"], module["gradients"], module["evaluate"]
        sig = self.signature
        self._params = {p.name: self._put(program.initial_params[p.name]) for p in sig.params}
        self._buffers = {b.name: self._put(program.initial_buffers[b.name]) for b in sig.buffers}
        self._state = [self._put(np.zeros(s.shape, np.float32)) for s in sig.state]
        self._step = self._put(np.zeros((), np.float32))
        self._seeded = bool(sig.inputs) and sig.inputs[-1].name == SEED_INPUT
        self._input_specs = sig.inputs[:-1] if self._seeded else sig.inputs
        self.seed = 0  # the dropout seed of the next call; step() increments it

    # -- data movement --------------------------------------------------------------------

    def _put(self, array: np.ndarray):
        return rt.asdevicearray(self._config.device, np.require(array, requirements="C"))  # keeps rank 0, unlike ascontiguousarray

    @staticmethod
    def _host(array) -> np.ndarray:
        return np.array(array.to_host())

    def _check(self, values, specs: list[TensorSpec]) -> list[np.ndarray]:
        values = [_to_numpy(v) for v in values]
        if len(values) != len(specs):
            raise InputError(f"expected {len(specs)} input tensor(s) ({', '.join(s.name for s in specs)}), got {len(values)}")
        checked = []
        for v, spec in zip(values, specs):
            if v.dtype == np.int64 and spec.dtype == "int32":
                v = v.astype(np.int32)  # the device takes int32 indices
            if tuple(v.shape) != tuple(spec.shape) or str(v.dtype) != spec.dtype:
                raise InputError(f"{spec.name}: expected shape {tuple(spec.shape)} and dtype {spec.dtype}, "
                                 f"got shape {tuple(v.shape)} and dtype {v.dtype}; the program was compiled for the "
                                 f"example batch's shape (recompile for another batch size)")
            checked.append(self._put(v))
        return checked

    def _inputs(self, inputs):
        checked = self._check(_as_tuple(inputs), self._input_specs)
        if self._seeded:
            checked.append(self._put(np.array(self.seed & 0xFFFFFFFF, np.uint32).view(np.int32)))
        return checked

    def _batch(self, inputs, target):
        return self._inputs(inputs) + self._check((target,), [self.signature.target])

    def _model_state(self):
        return list(self._params.values()) + list(self._buffers.values())

    # -- the API ---------------------------------------------------------------------------

    def step(self, inputs, target) -> float:
        """One optimizer update; returns the loss before the update. Dropout masks come from
        `self.seed`, which then increments, so every step draws fresh masks."""
        results = self._train_step(*self._model_state(), *self._state, self._step, *self._batch(inputs, target))
        loss, rest = results[0], list(results[1:])
        n = len(self.signature.trainable)
        for name, value in zip(self.signature.trainable, rest[:n]):
            self._params[name] = value
        self._state = rest[n:n + len(self._state)]
        self._step = rest[-1]
        self.seed += 1
        return float(self._host(loss))

    def gradients(self, inputs, target) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the gradients of the trainable parameters, without updating them."""
        results = self._gradients(*self._model_state(), *self._batch(inputs, target))
        grads = {name: self._host(g) for name, g in zip(self.signature.trainable, results[1:])}
        return float(self._host(results[0])), grads

    def evaluate(self, inputs) -> np.ndarray:
        """The model's output for a batch of the compiled shape (in the mode the model was compiled
        in: a model in training mode applies dropout, with `self.seed`)."""
        return self._host(self._evaluate(*self._model_state(), *self._inputs(inputs)))

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and buffers by state_dict name, copied to the host."""
        state = {name: self._host(v) for name, v in self._params.items()}
        state.update({name: self._host(v) for name, v in self._buffers.items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        known = {s.name: s for s in self.signature.params + self.signature.buffers}
        unknown = sorted(set(state) - set(known))
        if unknown:
            raise InputError(f"unknown state_dict entries: {', '.join(unknown)}")
        for name, value in state.items():
            (array,) = self._check((value,), [known[name]])
            (self._params if name in self._params else self._buffers)[name] = array

    @property
    def steps_taken(self) -> int:
        return int(self._host(self._step))
