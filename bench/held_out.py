"""`python -m bench.held_out`: the held-out protocol (#65). pock-mlir's tuning tables, flag sets
and heuristics were fitted on the bench's ten models (bench/iree_study.py and
pock_mlir/tuning/*.json read bench.models.MODELS only): those are the FIT part. The HELD-OUT part
(bench.zoo.HELD_OUT) is the zoo's torchvision/timm/Hugging Face models and small edge models of
each kind at batches 1-8, which nothing was fitted on. Both parts run the same systems side by
side, round by round (bench/__main__.py's measure), and the report gives each part's
distribution of pock-mlir's full step over the fastest peer's, sparse over full, the deployed
trainer's peak memory over the lowest peer's, and where each pock-mlir full step's time goes.

    python -m bench.held_out                          # both parts (the fit part takes the longest)
    python -m bench.held_out --part held-out --models ho-tv-resnet,ho-kws-narrow
    python -m bench.held_out --rewrite-report         # held_out.md again from held_out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.__main__ import FULL_BESIDE, _cpu_name, measure, pock_flags
from bench.machine import runs_dir
from bench.models import MODELS
from bench.report import PEERS, SYSTEM_TITLES, _find
from bench.zoo import HELD_OUT, bench_model
from pock_mlir.files import atomic_write
from pock_mlir.tuning import TUNING_DIR, host_cpu, table_path

PARTS = {"fit": tuple(MODELS), "held-out": tuple(HELD_OUT)}
SYSTEMS = ("eager", "torch.compile", "ort-training", "jax", "executorch", "pock-mlir", "pock-mlir-deployed")
SCHEMES = ("full", "sparse")
# The sparse rounds time pock-mlir's full step too: sparse over full from one set of rounds.
SCHEME_SYSTEMS = {"full": SYSTEMS, "sparse": (*SYSTEMS, FULL_BESIDE)}
AHEAD_SHARE, WORST_RATIO = 0.8, 1.25  # #65's targets: ahead on 80% of the held-out models, never over 1.25x


def model_summary(rows: list[dict], model: str) -> dict:
    """One model's ratios: pock-mlir's full step over the fastest peer's, its sparse step over its
    full step (the one timed in the sparse rounds, in a report that has it), the deployed trainer's
    peak memory over the lowest peer's (each scheme), and the profile's split of the full step into
    dispatch time and host overhead. sparse_trains_all: the sparse scheme trains every parameter the
    full step does (its step is a full step: no sparse update to be faster by)."""
    pock_full, pock_sparse = _find(rows, model, "full", "pock-mlir"), _find(rows, model, "sparse", "pock-mlir")
    summary = {"model": model}
    peers = [r for r in (_find(rows, model, "full", s) for s in PEERS) if r]
    deployed_full = _find(rows, model, "full", "pock-mlir-deployed")
    if pock_full and peers:
        fastest = min(peers, key=lambda r: r["step_ms"])
        summary.update(fastest_peer=fastest["system"], full_vs_fastest_peer=pock_full["step_ms"] / fastest["step_ms"])
        if deployed_full:  # as a user deploys it, a process without torch as ONNX Runtime's and JAX's are
            summary["deployed_full_vs_fastest_peer"] = deployed_full["step_ms"] / fastest["step_ms"]
    full_beside = _find(rows, model, "sparse", FULL_BESIDE) or pock_full
    if full_beside and pock_sparse:
        summary["sparse_vs_full"] = pock_sparse["step_ms"] / full_beside["step_ms"]
        trained = (pock_sparse.get("trainable_params"), full_beside.get("trainable_params"))
        summary["sparse_trains_all"] = None not in trained and trained[0] == trained[1]
    memory = {}
    for scheme in SCHEMES:
        deployed = _find(rows, model, scheme, "pock-mlir-deployed")
        peer_mb = [r["peak_mb"] for r in (_find(rows, model, scheme, s) for s in PEERS) if r]
        if deployed and peer_mb:
            memory[scheme] = deployed["peak_mb"] / min(peer_mb)
    if memory:
        summary["deployed_memory_vs_lowest_peer"] = memory
    profile = (pock_full or {}).get("profile")
    if profile:
        dispatch = profile["dispatch_ms_per_step"]
        summary.update(
            dispatch_share=dispatch / pock_full["step_ms"],
            host_overhead_ms=pock_full["step_ms"] - dispatch,
            top_kind=profile["by_kind"][0]["kind"] if profile["by_kind"] else None,
        )
    return summary


def distribution(summaries: list[dict]) -> dict:
    """A part's distribution over its measured models: median and worst of each ratio, the share of
    models where pock-mlir's full step is ahead of the fastest peer, and #65's targets checked."""
    full = [s["full_vs_fastest_peer"] for s in summaries if "full_vs_fastest_peer" in s]
    sparse = [s["sparse_vs_full"] for s in summaries if "sparse_vs_full" in s and not s["sparse_trains_all"]]
    deployed = [s["deployed_full_vs_fastest_peer"] for s in summaries if "deployed_full_vs_fastest_peer" in s]
    memory = [v for s in summaries for v in s.get("deployed_memory_vs_lowest_peer", {}).values()]
    out = {"models_measured": len(full)}
    if full:
        out["full_vs_fastest_peer"] = {
            "median": statistics.median(full),
            "worst": max(full),
            "share_ahead": sum(r < 1.0 for r in full) / len(full),
        }
        out["targets"] = {
            f"ahead on >= {AHEAD_SHARE:.0%}": out["full_vs_fastest_peer"]["share_ahead"] >= AHEAD_SHARE,
            f"never worse than {WORST_RATIO}x": max(full) <= WORST_RATIO,
        }
    if deployed:
        out["deployed_full_vs_fastest_peer"] = {
            "median": statistics.median(deployed),
            "worst": max(deployed),
            "share_ahead": sum(r < 1.0 for r in deployed) / len(deployed),
        }
    if sparse:
        out["sparse_vs_full"] = {"median": statistics.median(sparse), "worst": max(sparse), "models": len(sparse)}
        out.setdefault("targets", {})["sparse never slower than full"] = max(sparse) <= 1.0
    if memory:
        out["deployed_memory_vs_lowest_peer"] = {"median": statistics.median(memory), "worst": max(memory)}
        out.setdefault("targets", {})["deployed peak memory below every peer's"] = max(memory) < 1.0
    return out


def summarize(results: dict) -> dict:
    """Each part's per-model summaries and distribution, from the rows of a run."""
    parts = {}
    for part, models in results["parts"].items():
        summaries = [model_summary(results["rows"], m) for m in models if any(r["model"] == m for r in results["rows"])]
        parts[part] = {"models": summaries, "distribution": distribution(summaries)}
    return parts


def _x(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def _sparse_cell(summary: dict) -> str:
    trains_all = " (trains every parameter: not in the target)" if summary.get("sparse_trains_all") else ""
    return _x(summary.get("sparse_vs_full")) + trains_all


def _table_used(machine: dict) -> str:
    if machine.get("tuning"):  # --as-unmeasured-cpu
        return f"shipped, but not used: as on a CPU without one, {machine['tuning']} answered"
    return "shipped" if machine["own_table"] else "none shipped (the nearest table answers)"


def _header(results: dict) -> str:
    machine = results["machine"]
    return (
        f"{results['date']}, {machine['cpu']} ({machine['cpu_id']}), {machine['cores']} cores, load average "
        f"{machine['load_before'][0]:.2f} before and {machine['load_after'][0]:.2f} after; this CPU's tuning "
        f"table: {_table_used(machine)}. "
        "Written by `python -m bench.held_out`; the protocol is in docs/benchmarks.md#held-out-models."
    )


def part_section(part: str, summary: dict, titles: dict) -> list[str]:
    """One part's distribution, the targets reached or missed, and its per-model table."""
    dist = summary["distribution"]
    lines = [f"## {part} part: distribution", ""]
    labels = {
        "full_vs_fastest_peer": f"pock-mlir full step / fastest peer's over {dist['models_measured']} models",
        "deployed_full_vs_fastest_peer": "the deployed trainer's full step (no torch) / fastest peer's",
        "sparse_vs_full": f"pock-mlir sparse step / its full step over the {dist.get('sparse_vs_full', {}).get('models')} "
        "models whose sparse scheme freezes some parameters",
        "deployed_memory_vs_lowest_peer": "deployed trainer's peak memory / the lowest peer's",
    }
    for key, label in labels.items():
        if key in dist:
            ratios = dist[key]
            ahead = f", ahead on {ratios['share_ahead']:.0%}" if "share_ahead" in ratios else ""
            lines.append(f"- {label}: median {_x(ratios['median'])}, worst {_x(ratios['worst'])}{ahead}")
    for target, reached in dist.get("targets", {}).items():
        lines.append(f"- target {target}: {'reached' if reached else 'MISSED'}")
    lines += [
        "",
        "| model | full / fastest peer | deployed full / fastest peer | fastest peer | sparse / full | deployed memory / lowest peer "
        "(full, sparse) | dispatch share | host overhead ms | top dispatch kind |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary["models"]:
        memory = s.get("deployed_memory_vs_lowest_peer", {})
        lines.append(
            f"| {titles.get(s['model'], s['model'])} | {_x(s.get('full_vs_fastest_peer'))} | {_x(s.get('deployed_full_vs_fastest_peer'))} | "
            f"{SYSTEM_TITLES.get(s.get('fastest_peer'), '')} | {_sparse_cell(s)} | "
            f"{', '.join(_x(memory.get(k)) for k in SCHEMES if k in memory)} | "
            + (
                f"{s['dispatch_share']:.0%} | {s['host_overhead_ms']:.2f} | {s['top_kind']} |"
                if "dispatch_share" in s
                else "| | |"
            )
        )
    return lines + [""]


def write_summary(results: dict, path: Path) -> None:
    """held_out_summary.md: the header and the held-out part's section alone, for the README to quote."""
    lines = [_header(results), ""]
    if "held-out" in results["summary"]:
        lines += part_section("held-out", results["summary"]["held-out"], results["titles"])
    atomic_write(path, "\n".join(lines).rstrip("\n") + "\n")


def _part_line(results: dict, part: str, what: str) -> str:
    """Which models of `part` the report holds; for a part not run, its models all the same."""
    run = results["parts"].get(part)
    models = ", ".join(run) if run else f"not run in this report (its models: {', '.join(PARTS[part])})"
    return f"{part.upper()} part ({what}): {models}"


def write_markdown(results: dict, path: Path) -> None:
    lines = [
        "# Held-out models (#65)",
        "",
        _header(results),
        "",
        _part_line(results, "fit", "what the tuning tables, flag sets and heuristics were fitted on"),
        "",
        _part_line(results, "held-out", "nothing fitted on them"),
        "",
        "Ratios are of step medians from interleaved rounds, every system of a model and scheme taking turns "
        "in its own process, on a machine shared with other jobs. Below 1.00x pock-mlir is ahead.",
        "",
    ]
    for part, summary in results["summary"].items():
        lines += part_section(part, summary, results["titles"])
    lines += ["## Rows", "", "| model | scheme | system | step ms | peak MB | status |", "|---|---|---|---|---|---|"]
    for r in results["rows"]:
        ok = r["status"] == "ok"
        lines.append(
            f"| {r['model']} | {r['scheme']} | {r['system']} | {r['step_ms']:.2f} | {r['peak_mb']:.0f} | ok |"
            if ok
            else f"| {r['model']} | {r['scheme']} | {r['system']} | | | {r['status'][:120]} |"
        )
    atomic_write(path, "\n".join(lines) + "\n")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.held_out", description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=(*PARTS, "both"), default="both", help="which part to run")
    parser.add_argument("--models", help="comma-separated subset of the part's models")
    parser.add_argument(
        "--systems",
        help=f"comma-separated subset of {','.join(SYSTEMS)} (pock-mlir, whose report this is, is always measured)",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=None, help="directory for held_out.json/.md (default bench/runs/<machine>)")
    parser.add_argument("--rewrite-report", action="store_true", help="only rewrite held_out.md from held_out.json")
    parser.add_argument(
        "--as-unmeasured-cpu",
        action="store_true",
        help="compile by the nearest other CPU's table, as on a CPU without a shipped one "
        "(default --out: bench/runs/<machine>/unmeasured-cpu)",
    )
    args = parser.parse_args(argv)
    parts = PARTS if args.part == "both" else {args.part: PARTS[args.part]}
    if args.models:
        chosen = args.models.split(",")
        unknown = [m for m in chosen if not any(m in models for models in parts.values())]
        if unknown:
            parser.error(
                f"unknown {', '.join(unknown)}; choose from {', '.join(m for ms in parts.values() for m in ms)}"
            )
        parts = {part: tuple(m for m in chosen if m in models) for part, models in parts.items()}
    args.parts = {part: models for part, models in parts.items() if models}
    systems = set(args.systems.split(",")) if args.systems else set(SYSTEMS)
    if systems - set(SYSTEMS):
        parser.error(f"unknown {', '.join(sorted(systems - set(SYSTEMS)))}; choose from {', '.join(SYSTEMS)}")
    args.systems = [s for s in SYSTEMS if s in systems | {"pock-mlir"}]
    args.tuning = None  # what measure() gives pock-mlir's compilations: this CPU's table unless another
    if args.as_unmeasured_cpu:
        other = table_path("host", others_only=True)
        if other is None:
            parser.error(
                f"--as-unmeasured-cpu: no other CPU's table in {TUNING_DIR} shares this {host_cpu()}'s architecture"
            )
        args.tuning = str(other)
    args.out = Path(args.out) if args.out else runs_dir() / ("unmeasured-cpu" if args.as_unmeasured_cpu else "")
    args.iree_flags, args.profile = [], True  # what measure() reads: the host target's flags, profiled
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rewrite_report:
        results = json.loads((args.out / "held_out.json").read_text())
        results["summary"] = summarize(results)
        atomic_write(args.out / "held_out.json", json.dumps(results, indent=2) + "\n")
        write_markdown(results, args.out / "held_out.md")
        write_summary(results, args.out / "held_out_summary.md")
        return 0
    started, load_before, rows = time.time(), os.getloadavg(), []
    with tempfile.TemporaryDirectory(prefix="pock-held-out-") as workdir:
        for part, models in args.parts.items():
            for model in models:
                for scheme in SCHEMES:
                    systems = [
                        s
                        for s in SCHEME_SYSTEMS[scheme]
                        if (s in args.systems or s == FULL_BESIDE) and (s != "jax" or bench_model(model).jax_port)
                    ]
                    for system, row in measure(model, scheme, systems, args, Path(workdir)).items():
                        rows.append({"model": model, "scheme": scheme, "system": system, "part": part, **row})
                        shown = (
                            f"{row['step_ms']:.2f} ms, {row['peak_mb']:.0f} MB"
                            if row["status"] == "ok"
                            else row["status"]
                        )
                        print(f"{part:8s} {model:20s} {scheme:6s} {system:20s} {shown}", flush=True)
                    write(args, rows, started, load_before)  # a run cut short keeps what it measured
    print(f"wrote {args.out / 'held_out.json'} and held_out.md in {(time.time() - started) / 60:.1f} min")
    return 0


def write(args, rows: list[dict], started: float, load_before) -> None:
    from pock_mlir.tuning import own_table_path

    results = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_name(),
            "cpu_id": host_cpu(),
            "own_table": own_table_path("host").exists(),
            "tuning": args.tuning and Path(args.tuning).name,  # another CPU's table, --as-unmeasured-cpu
            "cores": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "shared": "yes: other engineers' jobs ran on this machine during the run",
        },
        "settings": {
            "steps": args.steps,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "pock_iree_flags": pock_flags(),
            "schemes": list(SCHEMES),
            "systems": list(SYSTEMS),
        },
        "parts": {part: list(models) for part, models in args.parts.items()},
        "titles": {m: bench_model(m).title for models in args.parts.values() for m in models},
        "rows": rows,
        "wall_s": time.time() - started,
    }
    results["summary"] = summarize(results)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "held_out.json", json.dumps(results, indent=2) + "\n")
    write_markdown(results, args.out / "held_out.md")
    write_summary(results, args.out / "held_out_summary.md")


if __name__ == "__main__":
    sys.exit(main())
