"""What pock-tune gains on this machine: each bench model's training step (full BP) compiled with
the table pock-tune measured for it here, side by side with the default (the shipped table of the
nearest CPU and its most alike program); step time, a Trainer's device memory, and the time
pock-tune took (prepare + run). Writes tune_results.json and tune_results.md in bench/runs/<machine>/.

    python -m bench.tune                     # every bench model (an hour or more on 2 cores)
    python -m bench.tune --models mlp,kws    # some; the others' rows are kept
    python -m bench.tune --shipped-table     # the default with this CPU's own shipped table
    python -m bench.tune --retime            # time the two programs again, by the tables kept

By default the bench hides this CPU's own shipped table, if it has one, so that the default is
what a CPU without one gets (the issue's case: the nearest CPU's table); --shipped-table keeps
it. Each condition has its own rows. The table pock-tune measured for each model is kept, in
tune_tables/<condition>/, and --retime times the two programs again from it (pock-tune's own
times are kept). The two programs take turns of back-to-back steps (pock_mlir/runtime/timing.py),
so that load from other jobs hits both alike; ratios are tuned / default (below 1: tuning gained).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import runs_dir
from bench.models import MODELS
from pock_mlir import tuning
from pock_mlir.files import atomic_write
from pock_mlir.runtime.timing import step_statistics, time_in_turns

ROOT = Path(__file__).resolve().parent
DEFAULT_MODELS = "mlp,bert,llama,resnet18,mobilenetv2,tiny-vit,tiny-llama,kws"
# the conditions of the default, by whether this CPU's own shipped table is hidden, and the
# directory of tune_tables/ that keeps each one's pock-tune tables
HIDDEN, SHIPPED = "without this CPU's shipped table", "with this CPU's shipped table"
TABLES = {HIDDEN: "hidden", SHIPPED: "shipped"}


@contextlib.contextmanager
def own_table_hidden(directory: Path):
    """pock_mlir.tuning reading its tables from `directory`, which holds them all but this CPU's
    host table: the default a CPU without a shipped table gets."""
    own = tuning.own_table_path("host")
    for table in tuning.TUNING_DIR.glob("*.json"):
        if table != own:
            (directory / table.name).symlink_to(table)
    shipped, tuning.TUNING_DIR = tuning.TUNING_DIR, directory
    try:
        yield
    finally:
        tuning.TUNING_DIR = shipped


def measure(name: str, steps: int, table: Path, work: Path, jobs: int | None, earlier: dict | None) -> dict:
    """The model's row: pock-tune run into `table`, unless `earlier` (a row of it, whose pock-tune
    times are kept) is given, then the default and the tuned program timed in turns."""
    import pock_mlir as pock
    from pock_mlir.runtime.tune import run
    from pock_mlir.tools.pock_compile import ModelFile
    from pock_mlir.tune import prepare

    spec = MODELS[name]
    model = spec.build()
    inputs, target = spec.batch()
    if earlier is None:
        start = time.perf_counter()
        file = ModelFile(model, inputs, target, spec.loss, None)
        prepare(file, name, "host", work / name, optimizer=spec.optimizer, jobs=jobs)
        prepared = time.perf_counter() - start
        run(work / name, table)
        tune_s = time.perf_counter() - start
        shutil.rmtree(work / name)
    else:
        tune_s, prepared = earlier["tune_s"], earlier["prepare_s"]
    programs = {
        "default": pock.compile_training(model, inputs, target, loss=spec.loss, optimizer=spec.optimizer),
        "tuned": pock.compile_training(model, inputs, target, loss=spec.loss, optimizer=spec.optimizer, tuning=table),
    }
    trainers = {label: program.trainer() for label, program in programs.items()}
    for trainer in trainers.values():
        for _ in range(3):
            trainer.step(inputs, target)
    load_before = os.getloadavg()[0]
    times = time_in_turns({label: lambda t=t: t.step(inputs, target) for label, t in trainers.items()}, steps)
    row = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "steps": steps,
        "load_average": [load_before, os.getloadavg()[0]],  # 1-minute, before and after the timed steps
        "tune_s": tune_s,
        "prepare_s": prepared,
        "run_s": tune_s - prepared,
        "default_tuning": programs["default"].backend.tuning,
    }
    for label, program in programs.items():
        row[label] = {
            **step_statistics(times[label]),
            "device_mb": trainers[label].device_bytes / 2**20,
            "choices": {
                "data_tiling": program.data_tiling.form,
                "vector_tails": program.vector_tails.form,
                "fusion": program.fusion.form,
                "convolutions": [f"{c.choice.form} {c.op}" for c in program.backend.ops.get("train_step", ())],
            },
        }
    row["step_ratio"] = row["tuned"]["step_ms_min"] / row["default"]["step_ms_min"]
    row["memory_ratio"] = row["tuned"]["device_mb"] / row["default"]["device_mb"]
    return row


def write_markdown(results: dict) -> str:
    lines = [
        f"# pock-tune on {results['device']}",
        "",
        "Generated by `python -m bench.tune`. The machine was shared with other jobs, so times are noisy (each "
        "row's 1-minute load average before and after its timed steps); ratios compare the two programs timed "
        "in turns. Tuned: the table pock-tune measured for the model on this machine; default: the shipped "
        "tables, as each row's tuning names. pock-tune's time counts a whole step found in pock-mlir's compile "
        "cache (compiled by an earlier row of the same program and flags) as no compilation.",
    ]
    for condition, rows in results["conditions"].items():
        lines += [
            "",
            f"## Default {condition}",
            "",
            "| model | step ms default | step ms tuned | step tuned/default | device MB tuned/default | pock-tune s "
            "(prepare + run) | choices that differ | load | measured |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, row in rows.items():
            d, t = row["default"]["choices"], row["tuned"]["choices"]
            differ = [f"{k}: {d[k]} -> {t[k]}" for k in ("data_tiling", "vector_tails", "fusion") if d[k] != t[k]]
            convs = sum(a != b for a, b in zip(d["convolutions"], t["convolutions"]))
            differ += [f"{convs} of {len(t['convolutions'])} convolution forms"] if convs else []
            lines.append(
                f"| {name} | {row['default']['step_ms_min']:.2f} | {row['tuned']['step_ms_min']:.2f} | "
                f"{row['step_ratio']:.2f} | {row['memory_ratio']:.2f} | {row['tune_s']:.0f} "
                f"({row['prepare_s']:.0f} + {row['run_s']:.0f}) | {'; '.join(differ) or 'none'} | "
                f"{row['load_average'][0]:.1f}, {row['load_average'][1]:.1f} | {row['date']}, {row['steps']} steps |"
            )
        lines += ["", *(f"Default: {applied}." for applied in sorted({row["default_tuning"] for row in rows.values()}))]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--steps", type=int, default=200, help="timed steps of each program")
    parser.add_argument(
        "--shipped-table", action="store_true", help="the default with this CPU's own shipped table, not hidden"
    )
    parser.add_argument("--jobs", type=int, default=None, help="pock-tune prepare's compilations at once")
    parser.add_argument(
        "--retime", action="store_true", help="time the two programs again from the kept tables, without pock-tune"
    )
    parser.add_argument(
        "--out", default=None, help="directory for tune_results.json/.md (default bench/runs/<machine>)"
    )
    args = parser.parse_args(argv)
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"--models: no bench model {', '.join(unknown)}; they are {', '.join(MODELS)}")
    out = Path(args.out) if args.out else runs_dir()
    results_path, report_path = out / "tune_results.json", out / "tune_results.md"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    if results and "conditions" not in results:
        parser.error(f"{results_path} was written by an older bench.tune; move it away")
    if results.get("device") not in (None, tuning.cpu_device()):
        parser.error(
            f"{results_path} holds results of {results['device']}, not this {tuning.cpu_device()}; move it away"
        )
    results.update(device=tuning.cpu_device())
    condition = SHIPPED if args.shipped_table else HIDDEN
    rows = results.setdefault("conditions", {}).setdefault(condition, {})
    tables = out / "tune_tables" / TABLES[condition]
    if args.retime:
        missing = [n for n in names if n not in rows or not (tables / f"{n}.json").exists()]
        if missing:
            parser.error(f"--retime: no row or kept table of {', '.join(missing)} {condition}; run them without it")
    tables.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pock-tune-bench-"))
    try:
        (work / "tables").mkdir()
        with contextlib.nullcontext() if args.shipped_table else own_table_hidden(work / "tables"):
            for name in names:
                print(f"bench.tune: {name}", file=sys.stderr, flush=True)
                earlier = rows.get(name) if args.retime else None
                rows[name] = measure(name, args.steps, tables / f"{name}.json", work, args.jobs, earlier)
                atomic_write(results_path, json.dumps(results, indent=1) + "\n")  # each model as it is done
                atomic_write(report_path, write_markdown(results))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
