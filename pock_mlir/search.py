"""Searching the sparse-update scheme under a memory and time budget: PockEngine's contribution
analysis (which layers and channels are worth training) and a selection under the device's budget.

    result = pock.search_sparse(model, (x_train, y_train), (x_val, y_val), loss="cross_entropy",
                                optimizer=pock.SGD(lr=0.05), budget=pock.Budget(memory_mb=40, step_time=0.5))
    result.sparse                # a SparseUpdate: compile_training(..., sparse=result.sparse)
    print(result.table())        # every candidate's measured gain and cost, and the scheme's
    result.write("scheme.yaml")  # for compile_training(sparse="scheme.yaml") and pock-compile --sparse

A list of budgets (budget=[Budget(memory_mb=6), Budget(memory_mb=12)]) returns one result per
budget from one full-BP compilation and one contribution analysis.

How, and what it costs:
  1. One compilation, of the model with every parameter trained (full BP). Its step is timed and
     its memory measured (Trainer.device_bytes, and the workspace IREE records per function):
     they calibrate the cost model.
  2. Contribution analysis. A candidate unit is one parameter tensor at one channel ratio r (its
     first ceil(r * C) output channels, as the sparse config's ratio means); a 1-D tensor (a
     bias, a norm's scale) is one unit. As in MIT's tiny-training contribution analysis, every
     run trains an anchor, by default the last layer's parameters (the classifier or head, which
     fine-tuning to new data trains in any scheme): the anchor fine-tunes alone first, for the
     base validation loss, then each candidate fine-tunes together with it for `steps` steps
     from the model's weights, on the same batches, and its gain is what it takes off the base
     loss. Judged alone, a layer under a frozen, freshly initialised head gains next to nothing
     whatever its worth. The full-BP program's `gradients` (its own IREE module, compiled on the
     first call) gives the gradients and torch.optim updates the trained rows on the host (the
     other parameters keep their start values). That
     costs (candidates + 1) x steps `gradients` calls of full BP, the trained tensors copied
     each way per call, and one validation pass per run: no compilation per candidate.
  3. Cost model. One run of the autodiff and sparse stages on the full-BP training IR splits the
     backward into each gradient's share (pock_mlir.cost.GradientShares): the backward of any
     scheme is the union of its gradients' shares, so a scheme's saved activations, gradient
     bytes and FLOPs cost a set union, and are not additive (layers share the activations
     between them). Memory: what the Trainer holds as parameters, buffers, optimizer state and
     the second set of what each step writes where not in place (exact, from the shapes, and
     full BP's Trainer.in_place), plus the workspace, from the
     forward's (measured) up to the full step's (measured) in proportion to the backward's saved
     activations and gradients, plus the largest channel-sparse tensor, which the step assembles
     whole there. Step time: the forward's and backward's FLOPs over full BP's. Over an int8 frozen
     base (quantize="int8"), each frozen layer weight counts as int8 plus a scale per channel; over
     an int4 one (quantize="int4"), as two values a byte plus a scale per group.
  4. Selection: from the anchor, a greedy knapsack over the measured gains per byte the combined
     scheme's memory grows by (a tensor may move up to a larger ratio for the gain that adds), or
     the best single unit when that alone gains more. Gains are taken as additive there; step 5
     measures the chosen scheme's real gain. Each budget of a list selects on the same measurements.
  5. Verification: IREE schedules the chosen scheme (its stream phase, about half of a
     compilation: TrainingProgram.schedule), which fixes its Trainer's device_bytes exactly
     (its measured memory), and that calibrates the cost model where it matters; only the scheme
     kept is compiled to the end. The room is what the budget leaves over the anchor's cost (the
     cheapest scheme); a scheme that measured above the budget, or used less than 1 - SLACK of
     the room, makes the selection run again within the room scaled by the
     scheme's estimated growth over the anchor's cost over its measured growth (the workspace's
     error grows with the scheme, and errs either way: over on CNN schemes that train only the
     last layers, under on some that reach the middle blocks). Once one scheme measured within
     the budget and one above it, the next selection is made between the two (their estimates),
     where the budget falls between what they measured: the error is not proportional (a pick
     of late layers that used a tenth of its room, scaled up, measured far above), so a step by
     its ratio alone overshoots or leads back. A selection repeating a measured scheme there costs
     no schedule: it narrows the bracket. Each retry above the budget selects less, never less
     than the anchor. At most MAX_SCHEDULES chosen schemes are scheduled; the best that measured
     within the budget wins. The chosen scheme then fine-tunes for `steps` steps on the same
     batches (its measured gain) and its steps are timed.
Deterministic for a seed: the batches, the candidates' order, ties, and the selection, which
reads FLOPs and bytes, never a time.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from pock_mlir.abi import EVALUATE, LOSS, TRAIN_STEP_INTO, Policy
from pock_mlir.cost import BackwardCost
from pock_mlir.data import Split, batch_order, evaluate
from pock_mlir.files import OutputError, atomic_write, check_writable
from pock_mlir.layers import frozen_weights
from pock_mlir.quantize import FORMATS
from pock_mlir.report import full_backward_shares
from pock_mlir.runtime.artifact import trainer_module
from pock_mlir.runtime.trainer import to_numpy
from pock_mlir.runtime.workspace import module_transient_bytes
from pock_mlir.sparse import SparseUpdate

MB = 2**20  # as the quality tables' "device MB"
RATIOS = (1 / 8, 1 / 4, 1 / 2, 1.0)
MAX_SCHEDULES = 4  # chosen schemes scheduled by IREE per budget (step 5 of the module docstring)
SLACK = 0.05  # a chosen scheme whose measured growth leaves at most this share of the room unused is not refined
MAX_SELECTIONS = 4 * MAX_SCHEDULES  # selections per budget, a repeat within the bracket costing no schedule
BRACKET_STEP = 0.1  # the least share of the bracket a selection between two measured schemes moves by
TIMED_STEPS = 6  # full-BP steps timed; the first is left out (warm-up)
PROGRESS_SECONDS = 5.0
YAML_HEADER = "# pock-search:"  # the first line of every scheme file it writes


class SearchError(ValueError):
    """The search cannot run as asked (data, budget, candidates), or no scheme meets the budget."""


@dataclass(frozen=True)
class Budget:
    """memory_mb: the device memory training may hold (Trainer.device_bytes), in MB of 2**20 bytes;
    step_time: the step's time as a fraction of the full-BP step. None is no limit; give one or both."""

    memory_mb: float | None = None
    step_time: float | None = None

    def __post_init__(self):
        if self.memory_mb is None and self.step_time is None:
            raise SearchError("Budget needs memory_mb, step_time or both")
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise SearchError(f"Budget memory_mb must be > 0, got {self.memory_mb}")
        if self.step_time is not None and not 0 < self.step_time <= 1:
            raise SearchError(f"Budget step_time is a fraction of the full-BP step, in (0, 1]; got {self.step_time}")

    @property
    def memory_bytes(self) -> float:
        return math.inf if self.memory_mb is None else self.memory_mb * MB

    @property
    def time_fraction(self) -> float:
        return math.inf if self.step_time is None else self.step_time

    def __str__(self) -> str:
        parts = ([f"memory {self.memory_mb:g} MB"] if self.memory_mb is not None else []) + (
            [f"step {self.step_time:g} of full BP"] if self.step_time is not None else []
        )
        return ", ".join(parts)


@dataclass(frozen=True)
class Unit:
    """A candidate: one parameter tensor, its first `ratio` of output channels (1.0: all of it)."""

    parameter: str
    ratio: float = 1.0

    @property
    def policy(self):
        """Its policy in a sparse config."""
        return "full" if self.ratio == 1.0 else self.ratio

    def rows(self, shape: tuple[int, ...]) -> int:
        """The output channels it trains (a scalar counts as one)."""
        return Policy("channels", self.ratio).channels(shape) if self.ratio < 1.0 else (shape[0] if shape else 1)

    def __str__(self) -> str:
        return self.parameter if self.ratio == 1.0 else f"{self.parameter} @{self.ratio:g}"


def candidate_units(shapes: dict[str, tuple[int, ...]], ratios=RATIOS) -> list[Unit]:
    """Every tensor of two or more dimensions at each ratio (ratios that keep the same channels
    counted once), every other tensor whole; in parameter order, smaller ratios first."""
    units = []
    for name, shape in shapes.items():
        if len(shape) < 2 or shape[0] == 1:
            units.append(Unit(name))
            continue
        rows_seen = set()
        for ratio in sorted(ratios):
            unit = Unit(name, ratio if Policy("channels", ratio).channels(shape) < shape[0] else 1.0)
            if unit.rows(shape) not in rows_seen:
                rows_seen.add(unit.rows(shape))
                units.append(unit)
    return units


# -- the cost model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    device_bytes: int  # what the Trainer would hold (see CostModel)
    time_fraction: float  # the step's FLOPs over full BP's
    backward: BackwardCost

    def fits(self, memory_bytes: float, time_fraction: float) -> bool:
        return self.device_bytes <= memory_bytes and self.time_fraction <= time_fraction


def _bytes(spec) -> int:
    return np.dtype(spec.dtype).itemsize * math.prod(spec.shape)


class CostModel:
    """A scheme's device memory and step time, from the compiler's backward of the full-BP program
    and that program's measured workspace (see the module docstring, 3). `int8_savings`: the bytes
    each layer weight saves while frozen under an int8 base (int8_savings())."""

    def __init__(self, program, int8_savings: dict[str, int] | None = None):
        sig = program.signature
        self.names, self.shares = full_backward_shares(program.ir("training"))
        self.index = {name: i for i, name in enumerate(self.names)}
        self.specs = {p.name: p for p in sig.params}
        buffers = {b.name: b for b in sig.buffers}
        self.slots = len(program.optimizer.state_slots)
        # What a Trainer that steps and validates holds: the step's module (gradients has its own).
        step_module = program.module(trainer_module(TRAIN_STEP_INTO))
        # What each step writes where it reads it (Trainer.in_place), taken to be full BP's for every scheme.
        self.copies = {role: 1 if role in step_module.in_place else 2 for role in sig.written()}
        # Parameters, buffers and the batch, and the second set of the buffers each step updates.
        self.fixed_bytes = sum(map(_bytes, sig.params + sig.buffers + sig.batch)) + (self.copies["buffers"] - 1) * sum(
            _bytes(buffers[n]) for n in sig.updated_buffers
        )
        self.int8_savings = int8_savings or {}
        transient = {
            function: module_transient_bytes(step_module.vmfb, function) or 0 for function in step_module.functions
        }
        self.forward_workspace = max(transient[LOSS], transient[EVALUATE])
        self.full_workspace = transient[TRAIN_STEP_INTO]
        full = self.shares.cost({i: 1.0 for i in range(len(self.names))})
        self.full_activity = max(full.saved_activation_bytes + full.gradient_bytes, 1)
        self.full_flops = max(self.shares.forward_flops + full.flops, 1)

    def estimate(self, units) -> Estimate:
        """The Estimate of training `units` (at most one per parameter), the rest frozen."""
        rows, spare_params, state, written_back = {}, 0, 0, 0
        for unit in units:
            spec = self.specs[unit.parameter]
            share = unit.rows(spec.shape) / (spec.shape[0] if spec.shape else 1)
            rows[self.index[unit.parameter]] = share
            spare_params += (self.copies["params"] - 1) * _bytes(spec)  # a second set holds whole tensors
            state += round(share * self.slots * 4 * math.prod(spec.shape))  # float32 state of the trained rows
            if share < 1:  # pock.channel_update assembles the whole tensor in the workspace
                written_back = max(written_back, _bytes(spec))
        backward = self.shares.cost(rows)
        activity = backward.saved_activation_bytes + backward.gradient_bytes
        workspace = written_back + max(
            self.forward_workspace,
            self.forward_workspace + (self.full_workspace - self.forward_workspace) * activity / self.full_activity,
        )
        # An int8 base stores the frozen layer weights so; a trained tensor stays float32.
        trained_names = {unit.parameter for unit in units}
        frozen_int8 = sum(saved for name, saved in self.int8_savings.items() if name not in trained_names)
        device = self.fixed_bytes - frozen_int8 + spare_params + self.copies["optimizer"] * state + round(workspace)
        return Estimate(device, (self.shares.forward_flops + backward.flops) / self.full_flops, backward)


def int8_savings(model, quantize: str | None) -> dict[str, int]:
    """{layer weight: the bytes it saves stored as int8 with a float32 scale per output channel, or
    as int4 with one per group} for the weights `quantize` stores so when frozen
    (pock_mlir/quantize.py); {} without it."""
    if quantize is None:
        return {}
    every_one_frozen = {name: Policy("frozen") for name, _ in model.named_parameters()}
    return {w.weight: w.saved_bytes for w in frozen_weights(model, every_one_frozen, quantize)}


# -- the contribution analysis ------------------------------------------------------------------


def as_split(data, what: str) -> Split:
    """(inputs, target), inputs an array or a tuple of arrays (torch or numpy), as a Split."""
    if isinstance(data, Split):
        return data
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise SearchError(
            f"{what} must be (inputs, target) with samples along the first dimension, got {type(data).__name__}"
        )
    inputs, target = data
    inputs = [to_numpy(x) for x in (inputs if isinstance(inputs, (tuple, list)) else (inputs,))]
    target = to_numpy(target)
    lengths = sorted({len(x) if x.ndim else 0 for x in [*inputs, target]})
    if len(lengths) > 1:
        raise SearchError(f"{what}: inputs and target must have the same number of samples, got {lengths}")
    return Split(inputs, target)


def training_batches(seed: int, samples: int, batch_size: int, steps: int) -> list[np.ndarray]:
    """`steps` batches of sample indices, epoch after epoch of pock-train's order for `seed`."""
    batches: list[np.ndarray] = []
    epoch = 0
    while len(batches) < steps:
        batches.extend(batch_order(seed, epoch, samples, batch_size))
        epoch += 1
    return batches[:steps]


def host_fine_tune(trainer, units: list[Unit], train: Split, batches, optimizer) -> dict[str, np.ndarray]:
    """Fine-tune `units` (one per parameter) together, one step per batch: the trainer's
    `gradients` (of a program that trains their parameters in full) and one torch.optim over the
    units' rows. The trainer holds the result, which is returned by parameter name; every other
    parameter stays as it was."""
    names = [unit.parameter for unit in units]
    state = trainer.state_dict()
    values = {name: state[name] for name in names}
    rows = {
        u.parameter: (slice(0, u.rows(values[u.parameter].shape)),) if values[u.parameter].ndim else () for u in units
    }
    kept = {name: torch.from_numpy(values[name][rows[name]].copy()).requires_grad_() for name in names}
    torch_optimizer = optimizer.torch_optimizer(list(kept.values()))
    for index in batches:
        _, grads = trainer.gradients(*train.batch(index), names=names)
        for name, tensor in kept.items():
            tensor.grad = torch.from_numpy(grads[name][rows[name]].copy())
        torch_optimizer.step()
        for name, tensor in kept.items():
            values[name][rows[name]] = tensor.detach().numpy()
        trainer.load_state_dict(values, strict=False)
    return values


@dataclass(frozen=True)
class Measurement:
    unit: Unit
    val_loss: float  # after fine-tuning the unit with the anchor
    gain: float  # the validation loss it removed beyond the anchor's
    cost: Estimate  # of training it with the anchor


class Progress:
    """Lines on stderr while the search runs (every PROGRESS_SECONDS at most), or nothing."""

    def __init__(self, enabled: bool):
        self.enabled, self.started, self.shown = enabled, time.perf_counter(), 0.0

    def say(self, message: str) -> None:
        if self.enabled:
            print(f"[pock-search] {message}", file=sys.stderr, flush=True)

    def measured(self, done: int, total: int, best: Measurement | None) -> None:
        now = time.perf_counter()
        if now - self.shown < PROGRESS_SECONDS and done < total:
            return
        self.shown = now
        left = (now - self.started) * (total - done) / done
        best_text = f"best so far {best.unit} (validation loss {-best.gain:+.4f})" if best else "no candidate yet"
        self.say(f"contribution: {done}/{total} candidates measured, {best_text}, about {left:.0f}s left")


def measure_contributions(
    trainer,
    candidates: list[Measurement],
    train: Split,
    val: Split,
    optimizer,
    batches,
    batch_size: int,
    progress: Progress,
    anchor: list[Unit] = (),
) -> tuple[float, list[Measurement]]:
    """The validation loss after fine-tuning the anchor alone (the start's when there is none), and
    the candidates (their cost known) measured, each fine-tuned with the anchor (see the module
    docstring, 2). The trainer ends as it started."""
    start = trainer.state_dict()

    def fine_tuned(units: list[Unit]) -> float:
        host_fine_tune(trainer, units, train, batches, optimizer)
        val_loss = evaluate(trainer, val, batch_size)["val_loss"]
        trainer.load_state_dict({u.parameter: start[u.parameter] for u in units}, strict=False)
        return val_loss

    progress.started = time.perf_counter()
    base = fine_tuned(list(anchor)) if anchor else evaluate(trainer, val, batch_size)["val_loss"]
    measurements: list[Measurement] = []
    for candidate in candidates:
        val_loss = fine_tuned([*anchor, candidate.unit])
        measurements.append(replace(candidate, val_loss=val_loss, gain=base - val_loss))
        progress.measured(len(measurements), len(candidates), max(measurements, key=lambda m: m.gain))
    return base, measurements


def last_layer(names: list[str]) -> list[Unit]:
    """The anchor "auto" means: the parameters of the module that owns the last parameter (its
    weight and bias), whole."""
    owner = names[-1].rpartition(".")[0]
    return [Unit(name) for name in names if name.rpartition(".")[0] == owner]


def anchor_units(anchor, names: list[str]) -> list[Unit]:
    """search_sparse's `anchor` ("auto", None, or parameter names) as whole-tensor Units."""
    if anchor is None:
        return []
    if anchor == "auto":
        return last_layer(names)
    chosen = [anchor] if isinstance(anchor, str) else list(anchor)
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise SearchError(
            f"anchor: {', '.join(map(repr, unknown)) or 'nothing'} is not a parameter of the model; "
            f'give "auto" (the last layer), None, or parameter names such as {names[-1]!r}'
        )
    return [Unit(name) for name in names if name in chosen]


# -- the selection ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    unit: Unit
    gain: float  # measured with the anchor, beyond its gain (0 for the anchor's own units)
    added_bytes: int  # what the scheme's estimated memory grew by when the unit came in
    added_time: float  # and its step time, as a fraction of the full-BP step


def check_something_fits(
    candidates: list[Measurement], costs: CostModel, memory_bytes: float, time_fraction: float, anchor: list[Unit] = ()
) -> None:
    """SearchError naming the cheapest scheme's cost when none fits the budget: the anchor alone,
    or without one the cheapest candidate alone."""
    budget = ", ".join(
        [f"{memory_bytes / MB:.3f} MB"] * math.isfinite(memory_bytes)
        + [f"a step of {time_fraction:g} of full BP"] * math.isfinite(time_fraction)
    )
    if anchor:
        cost = costs.estimate(anchor)
        if not cost.fits(memory_bytes, time_fraction):
            raise SearchError(
                f"no scheme fits the budget ({budget}): the cheapest scheme, training the anchor "
                f"({', '.join(map(str, anchor))}) alone, needs {cost.device_bytes / MB:.3f} MB and a step "
                f"of {cost.time_fraction:.3f} of full BP (estimated); give a larger budget, or anchor=None "
                f"(pock-search --anchor none) to judge candidates alone"
            )
        return
    if any(m.cost.fits(memory_bytes, time_fraction) for m in candidates):
        return
    cheapest = min(candidates, key=lambda m: (m.cost.device_bytes, m.cost.time_fraction))
    raise SearchError(
        f"no scheme fits the budget ({budget}): "
        f"the cheapest scheme, training {cheapest.unit} alone, needs {cheapest.cost.device_bytes / MB:.3f} "
        f"MB and a step of {cheapest.cost.time_fraction:.3f} of full BP (estimated)"
    )


def select(
    measurements: list[Measurement],
    costs: CostModel,
    memory_bytes: float,
    time_fraction: float,
    anchor: list[Unit] = (),
) -> list[Choice]:
    """The scheme under the budget (see the module docstring, 4): the anchor's units first, then the
    candidates chosen; SearchError when nothing fits."""
    check_something_fits(measurements, costs, memory_bytes, time_fraction, anchor)
    anchored = {unit.parameter for unit in anchor}
    candidates = [m for m in measurements if m.gain > 0 and m.unit.parameter not in anchored]
    gains = {m.unit: m.gain for m in candidates}
    if not gains and not anchor:
        raise SearchError(
            "no candidate lowered the validation loss when fine-tuned alone: raise the learning rate "
            "or the steps of the contribution analysis"
        )
    empty, start = costs.estimate([]), costs.estimate(anchor)
    base = [Choice(unit, 0.0, 0, 0.0) for unit in anchor]
    if anchor:  # the anchor's cost is its first unit's to carry
        base[0] = replace(
            base[0],
            added_bytes=start.device_bytes - empty.device_bytes,
            added_time=start.time_fraction - empty.time_fraction,
        )
    chosen: dict[str, Choice] = {}
    current = start
    while True:
        best = None
        for unit, gain in gains.items():
            held = chosen.get(unit.parameter)
            extra = gain - (held.gain if held else 0.0)
            if extra <= 0 or (held and unit.ratio <= held.unit.ratio):
                continue
            estimate = costs.estimate(
                [*anchor, *(c.unit for c in chosen.values() if c.unit.parameter != unit.parameter), unit]
            )
            if not estimate.fits(memory_bytes, time_fraction):
                continue
            score = extra / max(estimate.device_bytes - current.device_bytes, 1)
            if best is None or score > best[0]:
                best = (score, unit, estimate)
        if best is None:
            break
        _, unit, estimate = best
        held = chosen.get(unit.parameter)
        chosen[unit.parameter] = Choice(
            unit,
            gains[unit],
            (held.added_bytes if held else 0) + estimate.device_bytes - current.device_bytes,
            (held.added_time if held else 0.0) + estimate.time_fraction - current.time_fraction,
        )
        current = estimate
    single = max(
        (m for m in candidates if m.cost.fits(memory_bytes, time_fraction)), key=lambda m: m.gain, default=None
    )
    if single is not None and single.gain > sum(c.gain for c in chosen.values()):
        return [
            *base,
            Choice(
                single.unit,
                single.gain,
                single.cost.device_bytes - start.device_bytes,
                single.cost.time_fraction - start.time_fraction,
            ),
        ]
    return [*base, *chosen.values()]


def fit_to_budget(
    measurements: list[Measurement],
    costs: CostModel,
    budget: Budget,
    program_for,
    attempts: list[int],
    say: Progress,
    anchor: list[Unit] = (),
):
    """(choices, their program): the selection scheduled (`program_for(choices)`, a TrainingProgram
    or anything with the device_bytes of the Trainer it makes) and measured, within the memory
    budget. Each measurement sets the memory the next selection is made under (see the module
    docstring, 5) until the slack is under SLACK of the room, a selection repeats outside a bracket
    or MAX_SCHEDULES are spent; of the schemes that measured within the budget, the one with the
    most gain. `attempts` receives each measured device_bytes."""
    fitted, measured, memory = None, {}, budget.memory_bytes
    anchor_bytes = costs.estimate(anchor).device_bytes
    room = budget.memory_bytes - anchor_bytes
    within = above = (
        None  # (selection memory, measured bytes) of the largest scheme that fit, the smallest that did not
    )
    for _ in range(MAX_SELECTIONS):
        try:
            choices = select(measurements, costs, memory, budget.time_fraction, anchor)
        except SearchError:
            if not measured:
                raise
            break  # a budget lowered for an excess that nothing fits
        units = frozenset(c.unit for c in choices)
        if units in measured and not (within and above):
            break  # the calibration led back to a scheme measured already
        scheduled = units not in measured
        if scheduled:
            estimated = costs.estimate([c.unit for c in choices]).device_bytes
            say.say(f"scheduling the chosen scheme: {len(choices)} tensor(s), estimated {estimated / MB:.3f} MB")
            program = program_for(choices)
            attempts.append(measured.setdefault(units, program.device_bytes))
            slack = budget.memory_bytes - attempts[-1]
            if slack >= 0 and (fitted is None or sum(c.gain for c in choices) > sum(c.gain for c in fitted[0])):
                fitted = choices, program
            if budget.memory_mb is None or 0 <= slack <= SLACK * room or len(measured) == MAX_SCHEDULES:
                break
        # where the scheme was selected: at its estimate (the selection under more memory found no more)
        point = (estimated if scheduled else memory, measured[units])
        if point[1] > budget.memory_bytes:
            above = min(above or point, point)
        else:
            within = max(within or point, point)
        if within and above:
            (low, low_bytes), (high, high_bytes) = within, above
            if high - low <= SLACK * room:
                break  # a bracket no wider than the slack allowed; or a larger selection measured less
            # after a schedule, between the two by what they measured, off either end so that the
            # bracket shrinks; after a repeat, which says only on which side its selection falls, halfway
            share = (budget.memory_bytes - low_bytes) / (high_bytes - low_bytes) if scheduled else 0.5
            memory = low + (high - low) * min(max(share, BRACKET_STEP), 1 - BRACKET_STEP)
        else:  # the scheme just scheduled: a repeat outside a bracket stopped above
            scaled = anchor_bytes + room * max(estimated - anchor_bytes, 0) / max(point[1] - anchor_bytes, 1)
            memory = scaled if above else max(scaled, memory + budget.memory_bytes - point[1])
        if scheduled:
            say.say(
                f"it measures {point[1] / MB:.3f} MB against the budget's {budget.memory_bytes / MB:.3f}: "
                f"selecting again as if the budget were {memory / MB:.3f} MB"
            )
    if fitted is None:
        raise SearchError(
            f"the chosen schemes measured {', '.join(f'{b / MB:.3f}' for b in attempts)} MB on the device, "
            f"above the budget of {budget.memory_mb:g} MB; give a larger budget"
        )
    return fitted


def scheme_of(choices: list[Choice], quantize: str | None = None) -> SparseUpdate:
    return SparseUpdate(rules=[(c.unit.parameter, c.unit.policy) for c in choices], default="frozen", quantize=quantize)


# -- the result ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """A compiled program's measured device memory, step time and fine-tuning result."""

    device_bytes: int
    step_seconds: float  # median over its timed steps
    val_loss: float  # after its fine-tuning steps (the start's, for full BP)


@dataclass
class SearchResult:
    """What search_sparse chose and measured; `sparse` is the scheme."""

    budget: Budget
    choices: list[Choice]  # the anchor's units first
    measurements: list[Measurement]
    estimate: Estimate  # the chosen scheme's, by the cost model
    full: Run  # full BP, measured; val_loss is the start's
    chosen: Run  # the chosen scheme compiled and fine-tuned for `steps` steps
    steps: int
    seed: int
    anchor: list[Unit] = field(default_factory=list)  # trained in every run of the analysis
    anchored_loss: float = math.nan  # the validation loss after fine-tuning the anchor alone
    attempts: list[int] = field(default_factory=list)  # device bytes of each chosen scheme scheduled
    seconds: dict[str, float] = field(default_factory=dict)  # by phase
    quantize: str | None = None  # how the scheme stores its frozen layer weights (SparseUpdate.quantize)

    @property
    def sparse(self) -> SparseUpdate:
        """The chosen scheme (compile_training's sparse=)."""
        return scheme_of(self.choices, self.quantize)

    @property
    def measured_gain(self) -> float:
        """The validation loss the chosen scheme removed in `steps` steps, compiled."""
        return self.full.val_loss - self.chosen.val_loss

    @property
    def predicted_gain(self) -> float:
        """The anchor's gain alone plus each chosen candidate's beyond it."""
        return (self.full.val_loss - self.anchored_loss if self.anchor else 0.0) + sum(c.gain for c in self.choices)

    def _with(self) -> str:
        return f"with the anchor ({', '.join(map(str, self.anchor))})" if self.anchor else "alone"

    def table(self) -> str:
        """Every candidate's measured gain and cost (each trained with the anchor), then the chosen
        scheme against the budget."""
        picked = {c.unit for c in self.choices}
        width = max([len("candidate")] + [len(str(m.unit)) for m in self.measurements])
        lines = [
            f"  {'candidate':<{width}}  {'val loss gain':>13}  {'MB':>9}  {'step':>6}  chosen",
            *(
                f"  {str(m.unit):<{width}}  {m.gain:>13.5f}  {m.cost.device_bytes / MB:>9.3f}  "
                f"{m.cost.time_fraction:>6.3f}  {'yes' if m.unit in picked else ''}"
                for m in self.measurements
            ),
        ]
        anchor = (
            [
                f"anchor: {', '.join(map(str, self.anchor))}, validation loss {self.full.val_loss:.5f} -> "
                f"{self.anchored_loss:.5f} fine-tuned alone; the gains below are beyond it"
            ]
            if self.anchor
            else []
        )
        base = f", the frozen layer weights {self.quantize}" if self.quantize else ""
        return "\n".join(
            [
                f"sparse-scheme search, budget {self.budget}{base} (seed {self.seed}); each candidate trained "
                f"{self._with()}: its gain, device MB and step (a fraction of full BP's)",
                *anchor,
                *lines,
                "",
                *self.summary(),
            ]
        )

    def summary(self) -> list[str]:
        """The chosen scheme against the budget: memory, step time and gain, estimated and measured."""
        full_ms = 1000 * self.full.step_seconds
        runs = len(self.measurements) + bool(self.anchor)
        return [
            f"scheme: {len(self.choices)} tensor(s) trained; device memory estimated {self.estimate.device_bytes / MB:.3f} MB, "
            f"measured {self.chosen.device_bytes / MB:.3f} MB (full BP {self.full.device_bytes / MB:.3f} MB; budget: "
            f"{self.budget})",
            f"step: estimated {self.estimate.time_fraction:.3f}, measured {self.chosen.step_seconds / self.full.step_seconds:.3f} "
            f"of full BP's {full_ms:.2f} ms",
            f"validation loss gain in {self.steps} steps: {self.predicted_gain:.5f} predicted (the entries' gains "
            f"{self._with()}"
            + (", plus the anchor's" if self.anchor else "")
            + f"), {self.measured_gain:.5f} measured",
            f"search: {runs} runs x {self.steps} steps = {runs * self.steps} full-BP gradients calls; "
            f"full BP compiled, {len(self.attempts)} chosen scheme(s) scheduled and the one kept compiled; "
            f"{sum(self.seconds.values()):.0f}s in all: "
            + ", ".join(f"{phase} {s:.1f}s" for phase, s in self.seconds.items()),
        ]

    def to_yaml(self) -> str:
        """The scheme as a sparse config, a comment per entry with its cost and its measured gain."""
        base = f", over an {self.quantize} frozen base" if self.quantize else ""
        lines = [
            f"{YAML_HEADER} a sparse-update scheme searched under {self.budget}{base}",
            *(f"# {line}" for line in self.summary()),
            "default: frozen",
            *([f"quantize: {{frozen: {self.quantize}}}"] if self.quantize else []),
        ]
        anchor = set(self.anchor)
        for c in self.choices:
            gain = (
                f"the anchor: validation loss -{self.full.val_loss - self.anchored_loss:.5f} with the rest of it"
                if c.unit in anchor
                else f"validation loss -{c.gain:.5f} trained {self._with()}"
            )
            # JSON strings are YAML strings: a name is never read as a number or an alias.
            lines.append(
                f'"{c.unit.parameter}": {c.unit.policy}  # {gain}; '
                f"+{c.added_bytes / MB:.4f} MB, +{c.added_time:.3f} of the full-BP step"
            )
        return "\n".join(lines) + "\n"

    def write(self, path) -> Path:
        """Write to_yaml() to `path` atomically (check_scheme_path says what it refuses)."""
        path = check_scheme_path(path)
        atomic_write(path, self.to_yaml())
        return path


def check_scheme_path(path) -> Path:
    """A .yaml/.yml path that is writable and holds nothing but a scheme pock-search wrote."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml"):
        raise OutputError(f"{path}: a scheme file ends in .yaml or .yml")
    check_writable(path)
    if path.is_symlink() or path.exists():
        try:
            first = path.read_text(errors="replace").split("\n", 1)[0] if path.is_file() else ""
        except OSError:
            first = ""
        if not first.startswith(YAML_HEADER):
            raise OutputError(f"{path} exists and is not a scheme pock-search wrote; remove it or choose another path")
    return path


# -- the search ---------------------------------------------------------------------------------


def _check(
    model, train: Split, val: Split, budgets: list[Budget], steps: int, ratios, batch_size: int, quantize: str | None
) -> None:
    if not budgets or not all(isinstance(b, Budget) for b in budgets):
        raise SearchError(
            f"budget must be a pock.Budget(memory_mb=..., step_time=...) or a list of them, got {budgets!r}"
        )
    if not isinstance(steps, int) or steps < 1:
        raise SearchError(f"steps must be an integer >= 1, got {steps!r}")
    if not ratios or not all(isinstance(r, (int, float)) and 0 < r <= 1 for r in ratios):
        raise SearchError(f"ratios must be channel ratios in (0, 1], got {ratios!r}")
    if quantize not in (None, *FORMATS):
        raise SearchError(
            f"quantize must be None or one of {', '.join(map(repr, FORMATS))} (the frozen layer weights' "
            f"storage), got {quantize!r}"
        )
    for what, split in (("train_data", train), ("val_data", val)):
        if len(split) < batch_size:
            raise SearchError(f"{what} has {len(split)} samples, fewer than one batch ({batch_size})")
    resident = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) - sum(
        int8_savings(model, quantize).values()
    )
    for budget in budgets:
        if resident > budget.memory_bytes:
            raise SearchError(
                f"the memory budget {budget.memory_mb:g} MB is below the model's parameters and buffers "
                f"alone ({resident / MB:.3f} MB{f', the layer weights {quantize}' if quantize else ''}): no "
                f"scheme fits"
            )


def _timed_steps(trainer, train: Split, batches) -> float:
    """The median seconds of a training step over `batches`, the first left out."""
    seconds = []
    for index in batches:
        started = time.perf_counter()
        trainer.step(*train.batch(index))
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds[1:] or seconds))


def search_sparse(
    model,
    train_data,
    val_data,
    *,
    budget: Budget | list[Budget],
    loss="cross_entropy",
    optimizer=None,
    steps: int = 10,
    ratios=RATIOS,
    anchor="auto",
    batch_size: int = 32,
    seed: int = 0,
    output=None,
    target: str = "host",
    quantize: str | None = None,
    weights=None,
    progress: bool = False,
) -> SearchResult | list[SearchResult]:
    """Search which parameters (and output channels) to train under `budget` (see the module
    docstring): a SearchResult, whose `sparse` is the scheme; for a list of budgets, a list of
    SearchResults in its order, from one full-BP compilation and one contribution analysis.

    train_data, val_data: (inputs, target), inputs an array or a tuple of arrays (torch or numpy)
        with samples along the first dimension; the program trains on batches of `batch_size`.
    loss, optimizer, output, target, weights: as compile_training's (weights=: the files the model's
        weights start from, the model perhaps on the meta device); the optimizer fine-tunes
        candidates too.
    steps: fine-tuning steps per candidate (and of the chosen scheme's check).
    ratios: the channel ratios tried on each tensor of two or more dimensions.
    anchor: what every run trains besides its candidate, and every scheme holds: "auto" (the last
        layer's parameters), None (candidates judged alone), or a list of parameter names.
    seed: the batches' order. progress: lines on stderr (candidates measured, best so far, time left).
    quantize: "int8" (or "int4") searches schemes over an int8 (int4) frozen base (the sparse config's
        `quantize: {frozen: int8}`): the cost model counts the frozen layer weights so, and every scheme
        compiled stores them so; the gains are measured in float32 (the full-BP program freezes none).
    Raises SearchError when nothing fits a budget, naming the cheapest scheme's cost."""
    from pock_mlir.compiler import compile_training
    from pock_mlir.optim import SGD

    budgets = list(budget) if isinstance(budget, (list, tuple)) else [budget]
    optimizer = optimizer or SGD(lr=0.01)
    train, val = as_split(train_data, "train_data"), as_split(val_data, "val_data")
    _check(model, train, val, budgets, steps, ratios, batch_size, quantize)
    anchored = anchor_units(anchor, [name for name, _ in model.named_parameters()])
    say, shared = Progress(progress), {}
    example = train.batch(np.arange(batch_size))

    def compile_scheme(sparse, functions=("step", "loss", "evaluate")):
        return compile_training(
            model,
            tuple(example[0]),
            example[1],
            loss=loss,
            optimizer=optimizer,
            sparse=sparse,
            output=output,
            target=target,
            functions=functions,
            weights=weights,
        )

    started = time.perf_counter()
    say.say("compiling the full-BP step (every parameter trained)")
    program = compile_scheme(None)
    trainer = program.trainer()
    batches = training_batches(seed, len(train), batch_size, steps)
    start = trainer.state_dict()
    full_step = _timed_steps(trainer, train, training_batches(seed, len(train), batch_size, TIMED_STEPS))
    trainer.load_state_dict(start)
    costs = CostModel(program, int8_savings(model, quantize))
    full = Run(trainer.device_bytes, full_step, evaluate(trainer, val, batch_size)["val_loss"])
    shared["full BP"] = time.perf_counter() - started
    say.say(f"full BP: {full.device_bytes / MB:.3f} MB on the device, {1000 * full_step:.2f} ms a step")

    in_anchor = {unit.parameter for unit in anchored}
    units = [
        u
        for u in candidate_units({p.name: p.shape for p in program.signature.params}, ratios)
        if u.parameter not in in_anchor
    ]
    candidates = [Measurement(u, math.nan, math.nan, costs.estimate([*anchored, u])) for u in units]
    for each in budgets:  # before the long part
        check_something_fits(candidates, costs, each.memory_bytes, each.time_fraction, anchored)
    started = time.perf_counter()
    with_anchor = f", each with the anchor ({', '.join(map(str, anchored))})" if anchored else ""
    say.say(f"contribution analysis: {len(units)} candidates{with_anchor} x {steps} steps of full-BP gradients")
    anchored_loss, measurements = measure_contributions(
        trainer, candidates, train, val, optimizer, batches, batch_size, say, anchored
    )
    shared["contribution analysis"] = time.perf_counter() - started
    del trainer

    results = []
    for each in budgets:
        started = time.perf_counter()
        attempts: list[int] = []
        # each selection's memory from IREE's schedule alone; the chosen one's code generated once
        choices, scheduled = fit_to_budget(
            measurements,
            costs,
            each,
            lambda c: compile_scheme(scheme_of(c, quantize), functions=()),
            attempts,
            say,
            anchored,
        )
        chosen = scheduled.trainer()
        estimate = costs.estimate([c.unit for c in choices])
        chosen_run = Run(
            chosen.device_bytes, _timed_steps(chosen, train, batches), evaluate(chosen, val, batch_size)["val_loss"]
        )
        seconds = {**shared, "selection and check": time.perf_counter() - started}
        results.append(
            SearchResult(
                each,
                choices,
                measurements,
                estimate,
                full,
                chosen_run,
                steps,
                seed,
                anchored,
                anchored_loss if anchored else math.nan,
                attempts,
                seconds,
                quantize,
            )
        )
        say.say(f"done ({each}): " + results[-1].summary()[0])
    return results if isinstance(budget, (list, tuple)) else results[0]
