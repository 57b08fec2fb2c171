"""`python -m bench.drivers`: IREE's two CPU drivers for one compiled step (#65). local-task hands
each dispatch of a step to a pool of worker threads, one per core; local-sync runs every dispatch
in the calling thread. Small steps, whose dispatches are too short to share out, may pay more for
the hand-offs than the second core gives back, the more so where another process holds a core,
as on a phone or a board that also runs the app. Each model's full step (the bench's scheme) is
compiled once for the host and stepped by two Trainers of it, one on each driver, in turns
(pock_mlir/runtime/timing.py), on an idle machine and beside a process that keeps one core busy.
Writes drivers.json and drivers.md in bench/runs/<machine>/; ratios are local-sync / local-task
(below 1: local-sync is faster).

The compiler chooses each program's driver from these measurements (pock_mlir.tuning.choose_driver,
by the measured program nearest in FLOPs). The FIT part, whose rows also go into this CPU's tuning
table, is the bench's own models (the fit part of the held-out protocol, bench.held_out), whose
steps all take a millisecond or more, and SIZES, MLP steps of graded size from 0.1 to 400 MFLOP,
which are no model's: the held-out models are none of them. The report says, for each held-out
model, which driver that table chooses and whether it was the faster one idle.

    python -m bench.drivers --models fit          # the fit part, into this CPU's table
    python -m bench.drivers                       # the held-out models (bench.zoo), judged by it
    python -m bench.drivers --models ho-edge-mlp,ho-kws-narrow --steps 100
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from bench.child import device_batch
from bench.machine import measure_rows, runs_dir
from bench.models import MODELS, MOMENTUM_SGD, BenchModel
from bench.zoo import HELD_OUT, bench_model
from pock_mlir.files import atomic_write
from pock_mlir.runtime.timing import busy_share, step_statistics, time_in_turns
from pock_mlir.targets import CPU_DRIVERS
from pock_mlir.tuning import LOCAL_SYNC, LOCAL_TASK, MatmulFlops, Tuning, choose_driver, host_cpu, own_table_path

DRIVERS = (LOCAL_TASK, LOCAL_SYNC)


def _sized_mlp(width: int, batch: int) -> BenchModel:
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

    def make_batch():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(batch, 256, generator=g),), torch.randint(0, 10, (batch,), generator=g)

    title = f"MLP 256-{width}-{width}-10, batch {batch}"
    return BenchModel(f"size-mlp-{width}x{batch}", title, build, make_batch, "cross_entropy", MOMENTUM_SGD, {})


# steps of graded size, to place where one driver overtakes the other below the bench's models
SIZES = {
    m.name: m for m in (_sized_mlp(w, b) for w, b in ((32, 1), (64, 4), (128, 8), (256, 16), (512, 32), (512, 128)))
}
FIT = (*MODELS, *SIZES)
IDLE, ONE_CORE_BUSY = "idle", "one core busy"
SPIN = "while True: pass"  # another process's work on one core


@contextlib.contextmanager
def condition(name: str):
    """The machine as `name` says: as it is, or with a process spinning on one core meanwhile."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if name == ONE_CORE_BUSY else None
    try:
        if spinner:
            time.sleep(0.5)  # the spinner running before the first step
        yield
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def measure(name: str, steps: int) -> dict:
    """The model's row: its full step's ms on each driver under each condition."""
    import pock_mlir as pock

    spec = SIZES[name] if name in SIZES else bench_model(name)
    inputs, target = spec.batch()
    program = pock.compile_training(
        spec.build(), inputs, target, loss=spec.loss, optimizer=spec.optimizer, functions=("step",)
    )
    batch = device_batch(inputs, target)
    trainers = {driver: program.trainer(device=driver) for driver in DRIVERS}
    # "idle" is the machine as other jobs leave it: what share of its CPU time they took just before
    row = {
        "model": name,
        "title": spec.title,
        "steps": steps,
        "busy_before": busy_share(),
        "flops": dataclasses.asdict(program.backend.flops),  # what the driver is chosen by
    }
    for state in (IDLE, ONE_CORE_BUSY):
        with condition(state):
            seconds = time_in_turns({d: (lambda t=t: t.step(*batch)) for d, t in trainers.items()}, steps)
        timed = {driver: step_statistics(s) for driver, s in seconds.items()}
        row[state] = {
            **timed,
            "sync_vs_task": timed["local-sync"]["step_ms_median"] / timed["local-task"]["step_ms_median"],
        }
    # Both trainers took the same steps on the same batch: the drivers run the same kernels, so
    # their parameters agree (a driver that computed otherwise would make its timing meaningless).
    task, sync = (trainers[d].state_dict() for d in DRIVERS)
    row["max_parameter_difference"] = max(float(np.abs(task[k] - sync[k]).max(initial=0)) for k in task)
    return row


def write_fit_rows(rows: dict) -> Path:
    """The fit part's idle medians, with their programs' FLOPs, into this CPU's tuning table (the
    "drivers" section choose_driver reads); rows of other models measured before are kept."""
    path = own_table_path("host")
    table = json.loads(path.read_text()) if path.exists() else {}
    study = table.get("drivers", {})
    fit = {name: row for name, row in rows.items() if name in FIT}
    table["drivers"] = {
        "programs": {**study.get("programs", {}), **{name: row["flops"] for name, row in fit.items()}},
        "step_ms": {
            **study.get("step_ms", {}),
            **{name: {d: row[IDLE][d]["step_ms_median"] for d in DRIVERS} for name, row in fit.items()},
        },
    }
    atomic_write(path, json.dumps(table, indent=1) + "\n")
    return path


def chosen(row: dict, tuning: Tuning) -> str:
    """The driver the table chooses for a row's program."""
    return choose_driver(tuning, MatmulFlops(**row["flops"]), CPU_DRIVERS).form


def over(row: dict, state: str, driver: str, than: str | None = None) -> float:
    """`driver`'s median step over local-task's (or, with than="faster", over the faster driver's)."""
    ratio = row[state]["sync_vs_task"]
    time = ratio if driver == LOCAL_SYNC else 1.0
    return time / min(ratio, 1.0) if than == "faster" else time


def judged_summary(rows: list[dict], tuning: Tuning) -> str:
    """How the choice did on the held-out rows: the chosen driver's step against local-task's, the
    default before the choice, and against the faster driver's."""
    choices = [(row, chosen(row, tuning)) for row in rows]

    def geomean(values):
        return math.exp(sum(map(math.log, values)) / len(values))

    def spread(state: str, than: str | None = None) -> str:
        values = [over(row, state, driver, than) for row, driver in choices]
        return f"geometric mean {geomean(values):.2f}x, worst {max(values):.2f}x"

    faster = sum(over(row, IDLE, driver, "faster") == 1.0 for row, driver in choices)
    return (
        f"Held-out models judged by the fit part's table: {len(choices)}; the driver it chooses was the faster "
        f"idle on {faster}. Its median step over local-task's (the driver before the choice): idle "
        f"{spread(IDLE)}, one core busy {spread(ONE_CORE_BUSY)}; over the faster driver's, idle: "
        f"{spread(IDLE, 'faster')}."
    )


def markdown(results: dict) -> str:
    lines = [
        f"# IREE's CPU drivers for one step, on CPU {results['cpu']}",
        "",
        "Generated by `python -m bench.drivers`. Each model's full step, one compiled module stepped by a "
        "Trainer on each driver in turns; median step ms (fastest in brackets). Ratio: local-sync / "
        "local-task medians (below 1: local-sync faster). One core busy: beside a process spinning on "
        f"one core. {results['cores']} cores.",
        "",
        "| model | local-task ms idle | local-sync ms idle | sync / task idle "
        "| local-task ms one core busy | local-sync ms one core busy | sync / task one core busy "
        "| other jobs' CPU share before | chosen by the fit part | measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    table = own_table_path("host")  # as written just now (Tuning.of_target reads a file once a process)
    tuning = Tuning(table.name, json.loads(table.read_text()) if table.exists() else {})
    for row in results["rows"].values():
        cells = []
        for state in (IDLE, ONE_CORE_BUSY):
            timed = row[state]
            cells += [f"{timed[d]['step_ms_median']:.3f} ({timed[d]['step_ms_min']:.3f})" for d in DRIVERS] + [
                f"{timed['sync_vs_task']:.2f}"
            ]
        busy = "unknown" if row["busy_before"] is None else f"{100 * row['busy_before']:.0f}%"
        if row["model"] in FIT:
            judged = "fit part"
        elif "flops" in row:
            driver = chosen(row, tuning)
            judged = f"{driver} ({'the faster' if over(row, IDLE, driver, 'faster') == 1.0 else 'the slower'})"
        else:
            judged = "not recorded"
        lines.append(
            f"| {row['model']} | {' | '.join(cells)} | {busy} | {judged} | {row['date']}, {row['steps']} steps |"
        )
    held_out = [row for row in results["rows"].values() if row["model"] not in FIT and "flops" in row]
    if held_out:
        lines += ["", judged_summary(held_out, tuning)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drivers", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default=",".join(HELD_OUT),
        help="models, comma-separated (default: the held-out ones); fit: the fit part",
    )
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each driver under each condition")
    parser.add_argument("--out", type=Path, default=None, help="directory of the results (bench/runs/<machine>/)")
    args = parser.parse_args(argv)
    names = list(FIT) if args.models == "fit" else [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in HELD_OUT and n not in FIT]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; fit: {', '.join(FIT)}; held-out: {', '.join(HELD_OUT)}")
    out = args.out or runs_dir()
    out.mkdir(parents=True, exist_ok=True)

    def after(results: dict, name: str) -> None:
        if name in FIT:
            print(f"bench.drivers: wrote {write_fit_rows({name: results['rows'][name]})}", file=sys.stderr)
        atomic_write(out / "drivers.md", markdown(results))

    results = measure_rows(
        out / "drivers.json",
        names,
        lambda name: measure(name, args.steps),
        "bench.drivers",
        after,
        cpu=host_cpu(),
        cores=os.cpu_count(),
    )
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
