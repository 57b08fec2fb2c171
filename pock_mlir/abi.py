"""The compiled module's ABI: its functions, and the order of their arguments and results.

Everything that builds, writes, reads or calls the module derives that order from `layout`
(the builder in pock_mlir/training.py, the bundle writer and reader, the Trainer); this module
needs neither PyTorch nor torch-mlir, so devices load it.

    train_step(params..., buffers..., opt_state..., step, inputs..., target)
        -> (loss, updated trainable params..., new opt_state..., updated buffers..., step + 1)
    train_step_into(train_step's arguments..., loss buffer, one buffer per train_step result after the loss)
        -> ()                       (passes/pock_step_into.py: the results written into the buffers)
    gradients(params..., buffers..., inputs..., target) -> (loss, grads of trainable params...)
    loss(params..., buffers..., inputs..., target) -> loss       (forward only: validation)
    evaluate(params..., buffers..., inputs...) -> output
    loss_train, evaluate_train: loss and evaluate in train mode

loss and evaluate run the forward pass as the model in eval mode does (`model.eval()`: dropout
off, BatchNorm on its running statistics); loss_train and evaluate_train, as train_step does, in
the mode the model was compiled in.

The updated buffers are those the forward pass changes (the running statistics and batch counts
of train-mode BatchNorm), in `StepSignature.updated_buffers` order; gradients, loss and evaluate
compute the same forward pass but leave the buffers as they were. A model that draws dropout
masks has one more input after its own, `seed` (SEED_INPUT, an int32 scalar: pock_mlir/dropout.py),
in every function. A model called with keyword arguments (`model(**batch)`, `model(x, mask=m)`)
takes its positional inputs first, named input0, input1, ..., then its keyword inputs, named by
their keywords (`StepSignature.by_keyword`; `split_call` says how a batch gives them). Frozen
parameters are arguments only; a channel-sparse parameter's gradient and optimizer state cover
its leading rows (`StepSignature.trainable_shape`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

SEED_INPUT = "seed"
# The module's functions, as the docstring above lays them out; FORWARD_LOSS is the imported forward
# and loss (pock_mlir/frontend.py) they call, inlined before IREE compiles them.
# LOSS_TRAIN and EVALUATE_TRAIN are loss and evaluate with the train-mode forward (dropout on,
# BatchNorm on the batch's statistics); loss and evaluate are the model's eval-mode ones.
TRAIN_STEP, TRAIN_STEP_INTO, GRADIENTS, LOSS, EVALUATE, LOSS_TRAIN, EVALUATE_TRAIN = FUNCTIONS = (
    "train_step",
    "train_step_into",
    "gradients",
    "loss",
    "evaluate",
    "loss_train",
    "evaluate_train",
)
FORWARD_LOSS = "forward_loss"
RESERVED_INPUT_NAMES = (SEED_INPUT, "target")  # the dropout seed's and the target's names in every function


def positional_input_name(index: int) -> str:
    return f"input{index}"


def split_call(inputs) -> tuple[tuple, dict]:
    """A batch's model inputs as the (args, kwargs) of model(*args, **kwargs): a tensor (the one
    argument), a tuple or list of them, a dict of them by keyword (a tokenizer's or collator's
    batch), or a tuple of tensors ending in such a dict, also written as the pair (args, kwargs).
    A keyword whose value is None is no input, as if absent (an optional attention_mask)."""
    # tuples first: the Mapping check is an ABC's, the dearest part of a small step's batch
    if isinstance(inputs, (tuple, list)):
        if not (inputs and isinstance(inputs[-1], Mapping)):
            return tuple(inputs), {}
        args, kwargs = tuple(inputs[:-1]), inputs[-1]
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
    elif isinstance(inputs, Mapping):
        args, kwargs = (), inputs
    else:
        return (inputs,), {}
    wrong = [repr(k) for k in kwargs if not isinstance(k, str) or not k.isidentifier()]
    if wrong:
        raise ValueError(f"keyword inputs are named by the model's argument names; got the key(s) {', '.join(wrong)}")
    return args, {k: v for k, v in kwargs.items() if v is not None}


def call_inputs(flat: list, keywords: tuple[str, ...]):
    """A batch's model inputs as split_call takes them from the inputs in signature order, the last
    ones named by `keywords`: a list of positional ones, a dict of keyword ones, or the pair of both."""
    split = len(flat) - len(keywords)
    args, kwargs = list(flat[:split]), dict(zip(keywords, flat[split:]))
    return (args, kwargs) if args and kwargs else kwargs or args


def describe_call(positional: list[str], keywords: list[str]) -> str:
    """How a batch gives inputs, in words: "input0 and input1", "input_ids, attention_mask by keyword"."""
    parts = [", ".join(positional)] if positional else []
    parts += [f"{', '.join(keywords)} by keyword"] if keywords else []
    return " and ".join(parts) or "no inputs"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(entry: dict) -> TensorSpec:
        """A spec as to_json wrote it; ValueError naming what is malformed (a hand-edited manifest)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError(f"a tensor entry must be an object with a name, got {str(entry)[:80]}")
        shape, dtype = entry.get("shape"), entry.get("dtype")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{entry['name']}: shape must be a list of non-negative integers, got {str(shape)[:80]}")
        if dtype not in DTYPES:
            raise ValueError(f"{entry['name']}: dtype must be one of {', '.join(DTYPES)}, got {str(dtype)[:40]}")
        return TensorSpec(entry["name"], tuple(shape), dtype)


DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
# The kinds of layer whose weights LoRA adapts and int8 stores, by weight layout (pock_mlir/layers.py tells them apart):
# nn.Linear [out, in]; Hugging Face Conv1D [in, out]; nn.Conv2d [out, in/g, kh, kw]
KINDS = ("linear", "conv1d", "conv")


STEP_COUNT = TensorSpec("step", (), "float32")  # the optimizer's step count (float32, as torch.optim keeps it)
LOSS_VALUE = TensorSpec("loss", (), "float32")


@dataclass(frozen=True)
class Policy:
    """How one parameter tensor is updated: full, frozen, or its first `channels` rows."""

    kind: str = "full"  # full | frozen | channels
    ratio: float = 1.0

    def channels(self, shape: tuple[int, ...]) -> int:
        if self.kind != "channels":
            return shape[0] if shape else 0
        return max(1, math.ceil(self.ratio * shape[0]))


@dataclass(frozen=True)
class Slot:
    """One argument or result: its role and its tensor. Roles: params, buffers, optimizer (the
    state slots and the step count), batch (inputs and target), into (a buffer train_step_into
    writes a result into), loss (a result, or the buffer train_step_into writes it into), grads,
    output."""

    role: str
    spec: TensorSpec

    @property
    def path(self) -> str:
        """Where a bundle keeps it, relative to args/ or an output directory: a result that
        updates an argument has the argument's path, so a step's outputs can replace its inputs."""
        if self.role in ("loss", "output"):
            return f"{self.role}.npy"
        return f"{self.role}/{self.spec.name}.npy"


@dataclass
class StepSignature:
    params: list[TensorSpec]
    buffers: list[TensorSpec]
    updated_buffers: list[str]  # returned by train_step after the optimizer state
    trainable: list[str]
    state: list[TensorSpec]  # named "<param>.<slot>"
    inputs: list[TensorSpec]  # the model's inputs (positional, then keyword), then SEED_INPUT for a model with dropout
    target: TensorSpec
    output: TensorSpec
    policies: dict[str, Policy] = field(default_factory=dict)
    adapters: list = field(default_factory=list)  # lora.Adapter: LoRA adapters among the params (pock_mlir/lora.py)
    quantized: list = field(default_factory=list)  # quantize.QuantizedWeight: int8 weights (pock_mlir/quantize.py)
    by_keyword: int = 0  # the last this many model_inputs are keyword arguments of the model, named by keyword
    # model input -> rows of the embeddings its ids index (pock_mlir/frontend.py: embedding_vocabularies)
    vocabularies: dict[str, int] = field(default_factory=dict)
    # The model's state_dict keys, in its order, each with the tensor holding it as model_state
    # names it: a tied weight is one parameter under each of its keys, a non-persistent buffer is
    # under none (recorded by the frontend; by default the parameters and buffers themselves)
    state_dict: dict[str, str] | None = None

    def __post_init__(self):
        if self.state_dict is None:
            stored_only = self.stored_only
            self.state_dict = {s.name: s.name for s in self.params + self.buffers if s.name not in stored_only}
            self.state_dict.update({w.weight: w.weight for w in self.quantized})

    @property
    def stored_only(self) -> set[str]:
        """The parameters the model does not hold: LoRA adapters, int8 weights and their scales."""
        return {n for a in self.adapters for n in (a.a, a.b)} | {n for w in self.quantized for n in (w.values, w.scale)}

    def keyed_state(self, state: dict) -> dict:
        """The parameters and buffers `state` holds by name, under the model's state_dict keys (every
        key of a tied weight, no non-persistent buffer), then the parameters the model does not hold
        (stored_only) under their own names: what Trainer.state_dict() returns."""
        keyed = {key: state[source] for key, source in self.state_dict.items() if source in state}
        keyed.update({name: state[name] for name in sorted(self.stored_only)})
        return keyed

    @property
    def keyed_specs(self) -> dict[str, TensorSpec]:
        """The specs of keyed_state's entries, by key."""
        by_name = {spec.name: spec for spec in self.params + self.buffers}
        return {key: by_name[name] for key, name in self.keyed_state({n: n for n in by_name}).items()}

    def keys_of(self) -> dict[str, list[str]]:
        """Each parameter and buffer -> the keyed_state keys that hold it (none for a non-persistent buffer)."""
        keys: dict[str, list[str]] = {spec.name: [] for spec in self.params + self.buffers}
        for key, name in self.keyed_state({n: n for n in keys}).items():
            keys[name].append(key)
        return keys

    def trainable_shape(self, name: str) -> tuple[int, ...]:
        spec = next(p for p in self.params if p.name == name)
        policy = self.policies.get(name, Policy())
        if policy.kind == "channels":
            return (policy.channels(spec.shape),) + spec.shape[1:]
        return spec.shape

    @property
    def trained_values(self) -> int:
        """The parameter elements a step updates (a channel-sparse tensor counts its trained rows)."""
        return sum(math.prod(self.trainable_shape(name)) for name in self.trainable)

    @property
    def seeded(self) -> bool:
        """Whether the functions take a dropout seed after the model's inputs."""
        return bool(self.inputs) and self.inputs[-1].name == SEED_INPUT

    @property
    def batch(self) -> list[TensorSpec]:
        """A call's batch tensors in the order the functions take them: the model's inputs, the
        dropout seed (where the model has dropout), the target."""
        return [*self.inputs, self.target]

    @property
    def model_inputs(self) -> list[TensorSpec]:
        """The inputs a batch provides: all but the dropout seed, which the runtime supplies."""
        return self.inputs[:-1] if self.seeded else list(self.inputs)

    @property
    def keyword_inputs(self) -> list[TensorSpec]:
        """The model inputs a batch gives by keyword (named by their keywords), after the positional ones."""
        inputs = self.model_inputs
        return inputs[len(inputs) - self.by_keyword :]

    @property
    def positional_inputs(self) -> list[TensorSpec]:
        inputs = self.model_inputs
        return inputs[: len(inputs) - self.by_keyword]

    def flat_inputs(self, inputs) -> list:
        """A batch's model inputs, given as the model was called when compiled (see split_call), in
        model_inputs order; ValueError naming what differs from that call."""
        args, kwargs = split_call(inputs)
        if not kwargs and not self.by_keyword and len(args) == len(self.model_inputs):
            return list(args)  # the common call, checked without building the lists below
        positional, keywords = self.positional_inputs, [s.name for s in self.keyword_inputs]
        if len(args) != len(positional) or set(kwargs) != set(keywords):
            missing, unknown = [k for k in keywords if k not in kwargs], [k for k in kwargs if k not in keywords]
            differs = "; ".join(
                [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(unknown)}"] * bool(unknown)
            )
            given = describe_call([positional_input_name(i) for i in range(len(args))], list(kwargs))
            raise ValueError(
                f"the model was compiled to take {describe_call([s.name for s in positional], keywords)}; "
                f"got {given}{f' ({differs})' if differs else ''}"
            )
        return [*args, *(kwargs[k] for k in keywords)]

    @property
    def target_classes(self) -> int | None:
        """For an integer target, how many classes its values may index, read off the output's
        layout as PyTorch's cross-entropy losses take it: output [N, C, ...] for target [N, ...],
        or output [..., C] for target [...] (token logits); None for any other layout."""
        output, target = tuple(self.output.shape), tuple(self.target.shape)
        if not self.target.dtype.startswith("int") or len(output) != len(target) + 1:
            return None
        if output[:1] + output[2:] == target:
            return output[1]
        return output[-1] if output[:-1] == target else None

    def written(self) -> dict[str, list[TensorSpec]]:
        """What a step updates besides the loss and step count, by role: params (the trained ones),
        optimizer (its state), buffers (those the forward updates)."""
        by_name = {spec.name: spec for spec in self.params + self.buffers}
        return {
            "params": [by_name[n] for n in self.trainable],
            "optimizer": list(self.state),
            "buffers": [by_name[n] for n in self.updated_buffers],
        }

    def device_bytes(self, in_place: frozenset[str], workspace_bytes: int | None) -> int:
        """The device memory a trainer of this step holds: parameters, buffers, optimizer state, the
        second set of what each step writes where it is not written in place (roles of written(),
        as IREE's schedule allows: pock_mlir/in_place.py), the batch (a CPU driver's trainer keeps
        it in buffers of its own, see pock_mlir/runtime/workspace.py BatchSlots; elsewhere each
        call uploads it) and the workspace its calls share."""

        def size(specs) -> int:
            return sum(np.dtype(s.dtype).itemsize * math.prod(s.shape) for s in specs)

        spare = [spec for role, specs in self.written().items() if role not in in_place for spec in specs]
        return size(self.params + self.buffers + self.state + self.batch) + size(spare) + (workspace_bytes or 0)

    def written_argument_pairs(self) -> dict[str, list[tuple[int, int]]]:
        """By role (see written): train_step_into's (argument holding a tensor the step updates,
        argument its new value is written into), by position (pock_mlir/in_place.py checks whether
        they may be one buffer)."""
        arguments, _ = layout(self, TRAIN_STEP_INTO)
        position = {(slot.role, slot.spec.name): i for i, slot in enumerate(arguments)}
        return {
            role: [(position[role, spec.name], position["into", spec.name]) for spec in specs]
            for role, specs in self.written().items()
        }


def layout(signature: StepSignature, function: str) -> tuple[list[Slot], list[Slot]]:
    """(arguments, results) of one of FUNCTIONS, in order."""
    by_name = {spec.name: spec for spec in signature.params + signature.buffers}
    params = [Slot("params", p) for p in signature.params]
    buffers = [Slot("buffers", b) for b in signature.buffers]
    state = [Slot("optimizer", s) for s in signature.state]
    step = [Slot("optimizer", STEP_COUNT)]
    batch = [Slot("batch", i) for i in signature.inputs]
    target = [Slot("batch", signature.target)]
    loss = [Slot("loss", LOSS_VALUE)]
    if function in (TRAIN_STEP, TRAIN_STEP_INTO):
        arguments = params + buffers + state + step + batch + target
        results = (
            loss
            + [Slot("params", by_name[n]) for n in signature.trainable]
            + state
            + [Slot("buffers", by_name[n]) for n in signature.updated_buffers]
            + step
        )
        if function == TRAIN_STEP:
            return arguments, results
        return arguments + loss + [Slot("into", r.spec) for r in results[1:]], []
    if function == GRADIENTS:
        return params + buffers + batch + target, loss + [
            Slot("grads", TensorSpec(n, signature.trainable_shape(n), "float32")) for n in signature.trainable
        ]
    if function in (LOSS, LOSS_TRAIN):
        return params + buffers + batch + target, loss
    if function in (EVALUATE, EVALUATE_TRAIN):
        return params + buffers + batch, [Slot("output", signature.output)]
    raise ValueError(f"unknown function {function!r}; the module's functions are {', '.join(FUNCTIONS)}")


def runs(slots: list[Slot]) -> list[tuple[str, int]]:
    """The roles of `slots` as consecutive runs, (role, count): how a caller assembles an argument
    list from its per-role lists (in every function's arguments each role is one run)."""
    grouped: list[tuple[str, int]] = []
    for slot in slots:
        if grouped and grouped[-1][0] == slot.role:
            grouped[-1] = (slot.role, grouped[-1][1] + 1)
        else:
            grouped.append((slot.role, 1))
    return grouped
