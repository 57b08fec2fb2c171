"""Per-target implementation choices from measurements.

`<target>.json` beside this file holds the measurements (`python -m bench.iree_study convs` and
`flags`) of the bench's programs, the host's one file per CPU measured (`table_path`); a table
pock-tune measured (TABLE_FORMAT: one program's own convolutions and steps, on one device, see
docs/tuning-for-your-device.md) takes their place where given; `choose_conv_form` picks the
fastest measured form (pock_mlir/conv_forms.py) for the nearest measured shape,
`choose_data_tiling` whether IREE data-tiles a program's matmuls, `choose_vector_tails` how it
vectorizes loop remainders and `choose_fusion` how it forms dispatches, each as measured on the
most alike program, and `choose_driver` which CPU driver a Trainer steps it on, as measured on the
program of the nearest size.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from pock_mlir.conv_forms import ConvShape
from pock_mlir.iree_flags import (
    AGGRESSIVE_FUSION_SET,
    BASELINE_SET,
    DATA_TILED_AGGRESSIVE_FUSION_SET,
    DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET,
    DATA_TILED_MASKED_TAILS_SET,
    DATA_TILING_SET,
    IM2COL,
    MASKED_AGGRESSIVE_FUSION_SET,
    MASKED_TAILS_SET,
)
from pock_mlir.targets import CPU_DRIVERS, host_arch

TUNING_DIR = Path(__file__).resolve().parent
# The CPU drivers the driver study (bench.drivers) compares: local-task hands a step's dispatches
# to a worker thread per core, local-sync runs them all in the calling thread.
LOCAL_TASK, LOCAL_SYNC = CPU_DRIVERS


# -- the measured table ----------------------------------------------------------------


def host_cpu() -> str:
    """This machine's CPU as the host tables name it: architecture, then on Linux the vendor, family
    and model (x86) or implementer and part (ARM), e.g. x86_64-GenuineIntel-6-207."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    parts = [fields.get(k) for k in ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part")]
    return "-".join([host_arch(), *(p for p in parts if p)])


def own_table_path(target: str) -> Path:
    """Where this machine's measurements of `target` go (python -m bench.iree_study): the host's
    depend on the CPU, so each CPU measured has a file of its own, host-<host_cpu()>.json."""
    return TUNING_DIR / (f"host-{host_cpu()}.json" if target == "host" else f"{target}.json")


def table_path(target: str, others_only: bool = False) -> Path | None:
    """Where `target`'s measurements are: for the host, this CPU's file, else the one of the CPU
    sharing the longest start of its name (the same architecture at least: same vendor, then
    family), else this CPU's (absent). others_only: never this CPU's own file, as on a CPU that
    has none (the held-out bench's --as-unmeasured-cpu); None where no other CPU's shares the
    architecture."""
    if target != "host":
        return own_table_path(target)
    own = own_table_path(target)
    nearest = _nearest_cpu(p for p in TUNING_DIR.glob("host-*.json") if not (others_only and p == own))
    return nearest or (None if others_only else own)


def _nearest_cpu(host_tables) -> Path | None:
    """Of these host tables, the one of the CPU sharing the longest start of this CPU's name (the
    same architecture at least; of equals, the first by name); None where none shares it."""
    this = host_cpu().split("-")

    def shared(path: Path) -> int:
        other = path.stem.removeprefix("host-").split("-")
        return next((i for i, (a, b) in enumerate(zip(this, other)) if a != b), min(len(this), len(other)))

    best = max(((shared(p), p) for p in sorted(host_tables)), key=lambda sp: sp[0], default=(0, None))
    return best[1] if best[0] else None


def borrowed_driver_study() -> Tuning | None:
    """The host table of the CPU nearest this one (as table_path orders them) that has a driver
    study (python -m bench.drivers), never this CPU's own: what chooses the driver where the table
    answering for this CPU has none (choose_driver), rather than every step, small ones too,
    running on local-task (bench/runs/amd-epyc-25-17/drivers.md measures what that costs there)."""
    own = own_table_path("host")
    path = _nearest_cpu(p for p in TUNING_DIR.glob("host-*.json") if p != own and "drivers" in _read(p))
    return None if path is None else Tuning(f"target 'host' (CPU {path.stem.removeprefix('host-')})", _checked(path))


# What pock-tune writes: its bundle of candidates (pock_mlir/tune.py) and the table a device
# measures of them (pock_mlir/runtime/tune.py).
BUNDLE_FORMAT = "pock-tune-bundle"
TABLE_FORMAT = "pock-tune-table"


def iree_version(package: str) -> str:
    """The installed version of an IREE package (iree-base-compiler, iree-base-runtime), or "none"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cpu_device() -> str:
    """How a table names this machine's CPU as the device it measured (pock-tune run)."""
    return f"CPU {host_cpu()}"


def foreign(table: dict, target: str) -> list[str]:
    """How a pock-tune table was measured otherwise than for `target` here: another target (a base
    target name, as pock-backend-switch takes it, matches each of its options), another IREE
    runtime version, or, for the host, another CPU."""
    differs = []
    if table["target"] != target and table["target"].partition(":")[0] != target:
        differs.append(f"for target '{table['target']}', not '{target}'")
    if target.partition(":")[0] == "host" and table["device"] != cpu_device():
        differs.append(f"on {table['device']}, not this {cpu_device()}")
    runtime = iree_version("iree-base-runtime")
    if table["iree"]["runtime"] != runtime:
        differs.append(f"with IREE runtime {table['iree']['runtime']}, not this machine's {runtime}")
    return differs


@dataclass(frozen=True)
class Tuning:
    """A table of measurements (python -m bench.iree_study, or pock-tune) and how the choices'
    reasons name it."""

    name: str
    table: dict

    @classmethod
    def of_target(cls, target: str) -> Tuning:
        """The target's table; the host's is this CPU's, or says whose it is."""
        path = table_path(target)
        name = f"target '{target}'"
        if target == "host":
            cpu = path.stem.removeprefix("host-")
            name += f" (CPU {cpu})" if cpu == host_cpu() else f" (CPU {cpu}, not this {host_cpu()})"
        return cls(name, _checked(path) if path.exists() else {})

    @classmethod
    def from_file(cls, path: str, target: str | None = None, any_device: bool = False) -> Tuning:
        """A table given as a file, such as one measured on another machine; ValueError says what
        is wrong. A pock-tune table measured for another target, runtime or CPU (`foreign`) is
        refused for `target`, or with `any_device` used, its name saying so."""
        table = _checked(Path(path))
        if table.get("format") != TABLE_FORMAT:
            return cls(f"tuning file '{path}'", table)
        name = f"pock-tune table '{path}' ({table['device']}, IREE runtime {table['iree']['runtime']})"
        differs = foreign(table, target) if target is not None else []
        if differs and not any_device:
            raise ValueError(
                f"tuning table '{path}' was measured {'; '.join(differs)}: measure it here with pock-tune "
                "(docs/tuning-for-your-device.md), or give --tuning-any to use it anyway"
            )
        return cls(name + "".join(f", measured {d} (--tuning-any)" for d in differs), table)

    def measures_with(self, study: str, sets: str = "") -> str:
        """The command that measures what this table lacks: a `study` (convs, flags) of some flag `sets`."""
        if self.table.get("format") == TABLE_FORMAT:
            return "pock-tune prepare" + (f" --sets {sets}" if sets else "") + " and run"
        return f"python -m bench.iree_study {study}" + (f" --sets {sets}" if sets else "")

    def applied(self, flops: MatmulFlops) -> str:
        """Which measurements decide for a program of these FLOPs: a pock-tune table of its own
        (one that measured a program of exactly these FLOPs), one of another program's, or a
        table of the bench's programs, each choice by the most alike of them."""
        if self.table.get("format") == TABLE_FORMAT:
            own = any(MatmulFlops(**p) == flops for p in self.table["flags"]["programs"].values())
            model = self.table["model"]
            if own:
                return f"{self.name}, measured for this program ({model})"
            return f"{self.name}, measured for {model}, not this program: the nearest of its measurements decide"
        if not self.table:
            return f"no measurements for {self.name}: the baseline forms and flags"
        return f"{self.name}, the bench's programs: each choice by the most alike shape or program"


def _checked(path: Path) -> dict:
    """The table at `path`, checked to hold what the choices read; ValueError says what is wrong
    (such as a table an older study wrote, without a field the choices now read)."""
    try:
        table = _read(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read tuning table '{path}': {e}") from None
    try:
        _read_choices_inputs(table)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"tuning table '{path}' is not one python -m bench.iree_study writes "
            f"({type(e).__name__}: {e}): measure it again"
        ) from None
    return table


def _read_choices_inputs(table: dict) -> None:
    """Reads what the choices read of a table: a malformed one raises here, not in a pass."""
    if table.get("format") == TABLE_FORMAT:
        for key in ("target", "device", "model"):
            str(table[key])
        str(table["iree"]["runtime"])
    for case in table.get("convs", {}).get("cases", []):
        ConvShape.from_json(case["shape"])
        dict(case["ms"])
    flags = table.get("flags", {})
    for flops in flags.get("programs", {}).values():
        MatmulFlops(**flops)
    drivers = table.get("drivers", {})
    for flops in drivers.get("programs", {}).values():
        MatmulFlops(**flops)
    for model, ms in drivers.get("step_ms", {}).items():
        drivers["programs"][model]
        float(ms[LOCAL_TASK]), float(ms[LOCAL_SYNC])
    for sets in flags.get("step_ms", {}).values():
        for result in sets.values():
            float(result.get("step_ms_min", 0))


@cache
def _read(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class WeightCopies:
    """What data tiling would copy of a program's weights in a step (see MAX_WEIGHT_COPIES): the
    bytes of the matmul operands computed from parameters alone (a weight, or a view or unpacking of
    it; once per matmul reading it), and the bytes the parameters they come from are stored in."""

    copied: int
    stored: int

    @property
    def ratio(self) -> float:
        return self.copied / self.stored if self.stored else 0.0

    def describe(self) -> str:
        return (
            f"data tiling would re-lay {self.copied / 2**20:,.2f} MiB of weights, stored in "
            f"{self.stored / 2**20:,.2f} MiB, into its tile layout in every step ({self.ratio:.1f}x)"
        )


@dataclass(frozen=True)
class Measured:
    """The measurements a choice compared: the measured case it was decided on (a program of the
    flag study, a convolution's shape class) and each candidate's time there, by flag set or form
    (ms; infinite where the flag set failed to compile it), and where the study recorded it, a
    Trainer's device memory (MB)."""

    case: str
    ms: dict[str, float]
    device_mb: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    form: str
    reason: str
    measured: Measured | None = None  # what it was chosen by; None for a default or a rule


@dataclass(frozen=True)
class OpChoice:
    """pock-backend-switch's choice for one convolution or convolution gradient: what it is (its
    shape class) and the Choice."""

    op: str  # "weight_grad dense 3x3/s1 3->4 8x8 n2"
    choice: Choice


# the choices of a program compiled without pock-backend-switch
NOT_CHOSEN = "not chosen (no pock-backend-switch)"
NOT_CHOSEN_TABLE = "none (no pock-backend-switch)"


@dataclass(frozen=True)
class BackendChoices:
    """Everything pock-backend-switch chose for a module, as it hands it to compile_training: the
    whole program's data tiling, vector tails, fusion and driver, and each function's convolution
    forms."""

    data_tiling: Choice
    vector_tails: Choice
    fusion: Choice
    ops: dict[str, tuple[OpChoice, ...]]  # by function, in the order of its ops
    tuning: str = NOT_CHOSEN_TABLE  # which measurements decided (Tuning.applied)
    driver: Choice | None = None  # None: the target's default driver, not chosen
    flops: MatmulFlops | None = None  # what the choices read of the program


UNCHOSEN = BackendChoices(
    Choice("plain", NOT_CHOSEN), Choice("target default", NOT_CHOSEN), Choice("default", NOT_CHOSEN), {}
)


def _distance(a: ConvShape, b: ConvShape) -> float:
    """How unlike a measured shape is: different kernel, stride, dilation or family first, then size."""
    wa, wb = a.window, b.window
    structural = (
        (wa.kernel != wb.kernel)
        + (wa.stride != wb.stride)
        + (wa.dilation != wb.dilation)
        + (a.depthwise != b.depthwise)
        + (a.pointwise != b.pointwise)
    )
    taps = a.c * math.prod(wa.kernel) / (b.c * math.prod(wb.kernel))
    return 10 * structural + abs(math.log(a.macs() / b.macs())) + abs(math.log(taps))


# Measured: a ResNet block's strided 1x1 downsample as a direct convolution under IREE's im2col
# flag (every CPU target's) gave evaluate outputs off by 0.15 (tests/test_models_cnn.py).
MISCOMPILED_STRIDED_POINTWISE = (
    f"IREE 3.13 miscompiles the direct form of a strided 1x1 convolution under {IM2COL} (wrong values in evaluate)"
)


def choose_conv_form(tuning: Tuning, shape: ConvShape, op: str, min_speedup: float, exclude: str = "") -> Choice:
    """The fastest form measured for the nearest measured shape with the same set of forms; the
    op's baseline form (the first of shape.forms) unless another was at least `min_speedup`
    times faster there. A strided 1x1 convolution's forward is im2col whatever was measured:
    its direct form can be wrong. `exclude` is a form never chosen, alone or in a pair of
    gradients' forms (the next is the baseline where it is the first)."""
    implemented = shape.forms(op)
    excluded = [f for f in implemented if exclude in f.split("+")]
    forms = tuple(f for f in implemented if f not in excluded) or implemented  # an only form stays, excluded or not
    baseline = forms[0]
    if len(forms) == 1:
        return Choice(
            baseline,
            "the only form implemented for this shape"
            if len(implemented) == 1
            else f"the only form implemented but {exclude}",
        )
    if op == "forward" and "im2col" in forms and shape.window.kernel == (1, 1) and max(shape.window.stride) > 1:
        return Choice("im2col", MISCOMPILED_STRIDED_POINTWISE)
    cases = [(ConvShape.from_json(c["shape"]), c) for c in tuning.table.get("convs", {}).get("cases", [])]
    cases = [(s, c) for s, c in cases if s.forms(op) == implemented and f"{op}/{baseline}" in c["ms"]]
    if not cases:
        return Choice(baseline, f"no measurements for {tuning.name} ({tuning.measures_with('convs')})")
    _, case = min(cases, key=lambda sc: _distance(shape, sc[0]))
    timings = {form: case["ms"][f"{op}/{form}"] for form in forms if f"{op}/{form}" in case["ms"]}
    best = min(timings, key=timings.get)
    measured = ", ".join(f"{f} {t:.3f} ms" for f, t in sorted(timings.items(), key=lambda kv: kv[1]))
    where = f"measured on {tuning.name} for {case['class']}: {measured}"
    where += f" ({exclude} excluded)" if excluded else ""
    chosen = best if best != baseline and timings[baseline] / timings[best] >= min_speedup else baseline
    return Choice(chosen, where, Measured(case["class"], timings))


# -- IREE's data tiling and vector tails, per program --------------------------------------------

# each data tiling's sets, its baseline first: the data tiling is chosen by each one's fastest, as
# masked tails and data tiling both spare a matmul its remainder loop (a program can run fastest
# plain and masked, though data-tiled it beats plain peeled code: docs/targets-and-deploying.md)
PLAIN_SETS = (BASELINE_SET, MASKED_TAILS_SET, AGGRESSIVE_FUSION_SET, MASKED_AGGRESSIVE_FUSION_SET)
DATA_TILED_SETS = (
    DATA_TILING_SET,
    DATA_TILED_MASKED_TAILS_SET,
    DATA_TILED_AGGRESSIVE_FUSION_SET,
    DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET,
)
# A flag is chosen only where the nearest measured step was at least this much faster with it
# (whole steps vary by a few percent between rounds), or no slower and held at most this share of
# the device memory (a Trainer's, which does not vary): on a device memory is as scarce as time.
MAX_CHOSEN_RATIO = 0.95
# Data tiling re-lays each weight a matmul reads into the CPU's tile layout in every step (IREE
# encodes a function argument per call) and holds many of these copies at once: the 1B decoder's
# sparse step over an int4 base held 2.85 GiB of them for 1.3 GiB of state, peaking at 4.78 GiB
# against 2.51 plain, whose step took 1.26x the time (bench/runs/intel-xeon-6-207/NOTES.md). Float32
# weights are copied at 1-2x their own bytes (a forward, and input gradients where they flow),
# int8 at 4-8x, int4 at 7-14x: past this ratio a program is plain, whatever its speed measured.
MAX_WEIGHT_COPIES = 2.5
# Data tiling adds work of its own to a step (packing each matmul's operands into the tile layout,
# in dispatches of their own), which only a large enough matmul's faster kernel repays: a program
# whose largest matmul is more than this many times smaller than the most alike measured program's
# is plain, as that measurement does not carry down to it. On the EPYC 25-17 the flag study's
# data-tiled steps ran 0.85-0.88x the plain ones' time at a largest matmul of 0.5-6 GFLOP and
# 0.88-1.12x at 19-34 MFLOP (pock_mlir/tuning/host-x86_64-AuthenticAMD-25-17.json).
MAX_DATA_TILING_SHRINK = 10
# IREE's plain CPU matmul code handles a dimension that is not a multiple of its tile through a
# remainder path: 260 rows (a ViT's 4 x 65 tokens) ran 1.2-1.6x slower than 256, data-tiled not.
MATMUL_TILE = 8


@dataclass(frozen=True)
class MatmulFlops:
    """What the per-program choices read of a program: FLOPs of its convolutions and matmuls, and
    its softmaxes."""

    convolutions: int
    matmuls: int
    largest_matmul: int
    untiled_matmuls: int  # in matmuls with a dimension (M, K or N) not a multiple of MATMUL_TILE
    softmaxes: int  # attention's (a loss's log-softmax is not one)

    @property
    def convolution_led(self) -> bool:
        return self.convolutions >= self.matmuls

    @property
    def attention(self) -> bool:
        return self.softmaxes > 0

    @property
    def untiled_share(self) -> float:
        return self.untiled_matmuls / self.matmuls if self.matmuls else 0.0

    def describe(self) -> str:
        attention = "with attention" if self.attention else "no attention"
        if self.convolution_led:
            return f"convolutions carry most of the FLOPs, {attention}"
        return (
            f"matmuls carry most of the FLOPs, {attention}, largest matmul {self.largest_matmul / 1e6:.0f} MFLOP, "
            f"{100 * self.untiled_share:.0f}% of matmul FLOPs with a dimension not a multiple of {MATMUL_TILE}"
        )


def _unlikeness(a: MatmulFlops, b: MatmulFlops) -> tuple[int, float]:
    """How unlike two programs are, compared first in whether convolutions carry most of the FLOPs
    and whether they have attention (under aggressive fusion IREE 3.13 failed to compile every
    attention step the flag studies measured but the ViT's, and no plain step without attention),
    then in the size of the largest matmul and how much of the work misses the plain tile (the odd
    lengths that also leave vectorized loops a remainder)."""
    structure = (a.convolution_led != b.convolution_led) + (a.attention != b.attention)
    sizes = abs(math.log(max(a.largest_matmul, 1) / max(b.largest_matmul, 1)))
    return structure, sizes + 4 * abs(a.untiled_share - b.untiled_share)


def _measured_on_most_alike(
    tuning: Tuning, flops: MatmulFlops, flag_sets: tuple[str, ...], baselines: tuple[str, ...]
) -> tuple[Measured, MatmulFlops, str, str] | None:
    """(what it measured of the program, its MatmulFlops, the flag set and the baseline compared):
    the most alike program the target's flag study measured under the first of `flag_sets` and of
    `baselines`, with its fastest step under `flag_sets` and its fastest under `baselines` (on a
    shared machine the fastest step is the least disturbed); None if it measured none, or for a
    program without matmuls or convolutions, which is like none of them (IREE 3.13 failed to
    compile a step of dropouts alone under aggressive fusion)."""
    if not flops.matmuls and not flops.convolutions:
        return None
    study = tuning.table.get("flags", {})

    def fastest(sets: dict, names: tuple[str, ...]) -> tuple[str, dict]:
        measured = [(name, sets[name]) for name in names if "step_ms_min" in sets.get(name, {})]
        return min(measured, key=lambda pair: pair[1]["step_ms_min"], default=(names[0], {}))

    def compared(model: str, sets: dict) -> tuple[Measured, MatmulFlops, str, str]:
        (flag_set, flagged), (baseline, base) = fastest(sets, flag_sets), fastest(sets, baselines)
        # the flag sets may have failed to compile the program: infinitely slow
        ms = {flag_set: flagged.get("step_ms_min", math.inf), baseline: base["step_ms_min"]}
        memory = (
            {flag_set: flagged["device_mb"], baseline: base["device_mb"]}
            if "device_mb" in flagged and "device_mb" in base
            else {}
        )
        return Measured(model, ms, memory), MatmulFlops(**study["programs"][model]), flag_set, baseline

    measured = [
        compared(model, sets)
        for model, sets in study.get("step_ms", {}).items()
        if model in study.get("programs", {}) and flag_sets[0] in sets and "step_ms_min" in sets.get(baselines[0], {})
    ]
    return min(measured, key=lambda found: _unlikeness(flops, found[1]), default=None)


def _by_most_alike(
    tuning: Tuning,
    flops: MatmulFlops,
    what: str,
    flag_sets: tuple[str, ...],
    baselines: tuple[str, ...],
    forms: tuple[str, str, str],
    saying,
) -> Choice:
    """A per-program flag as the most alike measured program found it (_measured_on_most_alike):
    forms[0] where that program's fastest step under `flag_sets` took at most MAX_CHOSEN_RATIO of
    its fastest under `baselines`, or no more time and at most MAX_CHOSEN_RATIO of its device
    memory, else forms[1]; forms[2] without such a program. `saying(nearest, outcome, alike, sets)`
    words why (`sets`: the two sets compared)."""
    found = _measured_on_most_alike(tuning, flops, flag_sets, baselines)
    if found is None:
        why = (
            "no matmuls or convolutions, like no program measured"
            if not flops.matmuls and not flops.convolutions
            else f"no {what} measurements for {tuning.name} "
            f"({tuning.measures_with('flags', f'{baselines[0]},{flag_sets[0]}')})"
        )
        return Choice(forms[2], why)
    measured, alike, flag_set, baseline = found
    ratio = measured.ms[flag_set] / measured.ms[baseline]
    memory = measured.device_mb[flag_set] / measured.device_mb[baseline] if measured.device_mb else None
    if math.isinf(ratio):
        outcome = "failed to compile"
    else:
        outcome = f"took {ratio:.2f}x the time"
        outcome += f" and {memory:.2f}x the device memory" if memory is not None else ""
    chosen = ratio <= MAX_CHOSEN_RATIO or (ratio <= 1 and memory is not None and memory <= MAX_CHOSEN_RATIO)
    return Choice(
        forms[0] if chosen else forms[1], saying(measured.case, outcome, alike, (flag_set, baseline)), measured
    )


def choose_data_tiling(tuning: Tuning, flops: MatmulFlops, weights: WeightCopies | None = None) -> Choice:
    """Form "data-tiled" or "plain" for a whole program: data-tiled if the most alike program of
    the target's flag study took at most MAX_CHOSEN_RATIO of its fastest plain step's time at its
    fastest data-tiled one (of the sets measured with each data tiling, DATA_TILED_SETS and
    PLAIN_SETS; or no more time in less memory, see _by_most_alike), unless data tiling would copy
    more than MAX_WEIGHT_COPIES times the bytes of the program's `weights`."""
    measured = _by_most_alike(
        tuning,
        flops,
        "data-tiling",
        DATA_TILED_SETS,
        PLAIN_SETS,
        ("data-tiled", "plain", "plain"),
        lambda nearest, outcome, alike, sets: (
            f"{flops.describe()}; the most alike step measured "
            f"on {tuning.name}, {nearest} ({alike.describe()}), "
            f"{outcome} data-tiled, the fastest of each "
            f"({sets[0]} against {sets[1]})"
        ),
    )
    if measured.form == "data-tiled" and weights is not None and weights.ratio > MAX_WEIGHT_COPIES:
        return Choice(
            "plain", f"{weights.describe()}, more than {MAX_WEIGHT_COPIES}x; {measured.reason}", measured.measured
        )
    if measured.form == "data-tiled" and (far := _far_smaller(tuning, flops, measured.measured, "data tiling")):
        return Choice("plain", f"{far}; {measured.reason}", measured.measured)
    return measured


def _far_smaller(tuning: Tuning, flops: MatmulFlops, measured: Measured, what: str) -> str | None:
    """Why a measurement of `what` (a flag) does not carry to the program: its largest matmul is
    more than MAX_DATA_TILING_SHRINK times smaller than that of the program measured; None where
    it carries."""
    alike = MatmulFlops(**tuning.table["flags"]["programs"][measured.case])
    if flops.largest_matmul * MAX_DATA_TILING_SHRINK >= alike.largest_matmul:
        return None
    return (
        f"its largest matmul ({flops.largest_matmul / 1e6:.3f} MFLOP) is more than {MAX_DATA_TILING_SHRINK}x "
        f"smaller than that of the step {what} was measured on"
    )


def _by_most_alike_under(
    tuning: Tuning,
    flops: MatmulFlops,
    under: str,
    what: str,
    sets: tuple[str, str],
    forms: tuple[str, str, str],
    effect: str,
) -> Choice:
    """_by_most_alike under the program's other choices, `under` ("plain", "data-tiled, masked
    tails"): `sets` is the (flag set, baseline) measured so; `effect` words the flag ("with masked
    tails")."""
    flag_set, baseline = sets
    return _by_most_alike(
        tuning,
        flops,
        what,
        (flag_set,),
        (baseline,),
        forms,
        lambda nearest, outcome, *_: (
            f"the most alike step measured on {tuning.name} ({under}), {nearest}, {outcome} {effect}"
        ),
    )


def choose_vector_tails(tuning: Tuning, flops: MatmulFlops, data_tiled: bool) -> Choice:
    """How IREE vectorizes the remainder of a loop whose trip count is not a multiple of the
    vector width, for a whole CPU program: "masked" if the most alike program of the target's
    flag study, with the same data tiling, took at most MAX_CHOSEN_RATIO of its peeled step's
    time masked (or no more in less memory, see _by_most_alike), else "peeled"; "target default"
    without such measurements (targets.vector_tails)."""
    sets = (DATA_TILED_MASKED_TAILS_SET, DATA_TILING_SET) if data_tiled else (MASKED_TAILS_SET, BASELINE_SET)
    return _by_most_alike_under(
        tuning,
        flops,
        "data-tiled" if data_tiled else "plain",
        "vector-tails",
        sets,
        ("masked", "peeled", "target default"),
        "with masked tails",
    )


# (aggressive fusion's set, its baseline) by (data-tiled, masked tails): fusion is chosen under the
# program's data tiling and vector tails, which change what it gains (docs/targets-and-deploying.md)
FUSION_SETS = {
    (False, False): (AGGRESSIVE_FUSION_SET, BASELINE_SET),
    (False, True): (MASKED_AGGRESSIVE_FUSION_SET, MASKED_TAILS_SET),
    (True, False): (DATA_TILED_AGGRESSIVE_FUSION_SET, DATA_TILING_SET),
    (True, True): (DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET, DATA_TILED_MASKED_TAILS_SET),
}


# A small step is dispatch-bound, and aggressive fusion gives it fewer dispatches. Fusion measured on
# a program carries no further down than data tiling (MAX_DATA_TILING_SHRINK); below that, a plain
# step whose matmuls carry most of its FLOPs (as in the steps measured), without attention and with
# fewer FLOPs of matmuls and convolutions than this, is fused. On the EPYC 25-17 (python -m
# bench.fusion_sizes: MLP steps of graded size, the fit part), every step up to 38.6 MFLOP ran at
# 0.80-0.93x its unfused median time, on either CPU driver and with either tails; at 238 MFLOP, 0.91-0.99x.
SMALL_FUSED_FLOPS = 40_000_000


def choose_fusion(tuning: Tuning, flops: MatmulFlops, data_tiled: bool, masked_tails: bool) -> Choice:
    """ "aggressive" if IREE should form dispatches with its aggressive fusion: the most alike
    program of the target's flag study, with the same data tiling and vector tails, took at most
    MAX_CHOSEN_RATIO of its step's time without it, or no more time and at most MAX_CHOSEN_RATIO of
    its device memory, and compiled; else "default" (also where the study did not measure it
    under those, so that no program takes a combination never measured). A plain program whose
    matmuls carry most of its FLOPs and whose largest is more than MAX_DATA_TILING_SHRINK times
    smaller than that program's is decided by its size instead (SMALL_FUSED_FLOPS), unless IREE
    failed to compile that program with it."""
    under = ("data-tiled" if data_tiled else "plain") + (", masked tails" if masked_tails else "")
    measured = _by_most_alike_under(
        tuning,
        flops,
        under,
        "aggressive-fusion",
        FUSION_SETS[data_tiled, masked_tails],
        ("aggressive", "default", "default"),
        "with aggressive fusion",
    )
    if measured.measured is None or data_tiled or flops.convolution_led or math.inf in measured.measured.ms.values():
        return measured  # a failure to compile carries down: IREE may fail the smaller program alike
    far = _far_smaller(tuning, flops, measured.measured, "fusion")
    if far is None:
        return measured
    total = flops.matmuls + flops.convolutions
    small = total < SMALL_FUSED_FLOPS and not flops.attention
    return Choice(
        "aggressive" if small else "default",
        f"{far}, and it is {'a' if small else 'not a'} step "
        f"without attention under {SMALL_FUSED_FLOPS / 1e6:.0f} MFLOP of matmuls and convolutions "
        f"({total / 1e6:.1f}{', with attention' if flops.attention else ''}); {measured.reason}",
        measured.measured,
    )


# Where no table (this CPU's or a borrowed one) measured the drivers, a step of fewer FLOPs of
# matmuls and convolutions than this runs on local-sync: its dispatches are too short to hand to
# worker threads. The largest step of the driver study's sizes (bench.drivers) that ran faster on
# local-sync on the EPYC 25-17: 0.41-0.82x local-task's time up to 38.6 MFLOP, 1.22x at 238.
UNMEASURED_SYNC_FLOPS = 40_000_000


def choose_driver(
    tuning: Tuning, flops: MatmulFlops, drivers: tuple[str, ...], borrowed: Tuning | None = None
) -> Choice:
    """The IREE driver a Trainer steps the program on unless told otherwise: for a target whose
    modules run on both CPU drivers, "local-sync" where the program of the table's driver study
    (bench.drivers) nearest in FLOPs took at most MAX_CHOSEN_RATIO of its local-task step time on
    it (a small step's dispatches are too short to share out between cores), else the target's
    default driver, drivers[0]. Where the table measured no program so, `borrowed`'s study decides
    (another CPU's: borrowed_driver_study), else the program's size (UNMEASURED_SYNC_FLOPS)."""
    if not {LOCAL_TASK, LOCAL_SYNC} <= set(drivers):
        return Choice(drivers[0], f"the target's driver ({' or '.join(drivers)})")
    if not tuning.table.get("drivers", {}).get("step_ms") and borrowed is not None:
        tuning = Tuning(f"{borrowed.name}, as {tuning.name} has no driver measurements", borrowed.table)
    study = tuning.table.get("drivers", {})
    measured = [(model, MatmulFlops(**study["programs"][model]), ms) for model, ms in study.get("step_ms", {}).items()]
    if not measured:
        total = flops.matmuls + flops.convolutions
        small = total < UNMEASURED_SYNC_FLOPS
        return Choice(
            LOCAL_SYNC if small else drivers[0],
            f"no driver measurements for {tuning.name} (python -m bench.drivers): "
            f"{total / 1e6:.0f} MFLOP of matmuls and convolutions, "
            f"{'under' if small else 'not under'} {UNMEASURED_SYNC_FLOPS / 1e6:.0f}",
        )

    def size(f: MatmulFlops) -> float:
        return math.log(max(f.matmuls + f.convolutions, 1))

    model, alike, ms = min(measured, key=lambda m: abs(size(m[1]) - size(flops)))
    ratio = ms[LOCAL_SYNC] / ms[LOCAL_TASK]
    return Choice(
        LOCAL_SYNC if ratio <= MAX_CHOSEN_RATIO else drivers[0],
        f"{(flops.matmuls + flops.convolutions) / 1e6:.0f} MFLOP of matmuls and convolutions; the step nearest "
        f"in size measured on {tuning.name}, {model} ({(alike.matmuls + alike.convolutions) / 1e6:.0f} MFLOP), "
        f"took {ratio:.2f}x the time on {LOCAL_SYNC}",
        Measured(model, dict(ms)),
    )
