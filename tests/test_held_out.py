"""The held-out bench's protocol (bench/held_out.py, #65): its held-out part shares no model with
what pock-mlir's choices were fitted on, and its report's distribution is computed right on
planted rows (no model is compiled or timed)."""

import json
import statistics
from pathlib import Path

import pytest

from bench.__main__ import FULL_BESIDE
from bench.held_out import PARTS, distribution, model_summary, part_section, summarize
from bench.models import MODELS
from bench.zoo import HELD_OUT, bench_model

TUNING = Path(__file__).resolve().parent.parent / "pock_mlir" / "tuning"


def test_the_parts_are_disjoint_and_the_fit_part_is_the_bench():
    assert set(PARTS["fit"]) == set(MODELS)
    assert not set(PARTS["held-out"]) & set(MODELS)
    assert len(PARTS["fit"]) + len(PARTS["held-out"]) >= 20
    for name in PARTS["held-out"]:
        (inputs, target) = bench_model(name).batch()
        assert 1 <= inputs[0].shape[0] <= 8 and target.shape[0] == inputs[0].shape[0]


@pytest.mark.parametrize("table", sorted(TUNING.glob("*.json")), ids=lambda p: p.name)
def test_no_tuning_table_was_fitted_on_a_held_out_model(table):
    flags = json.loads(table.read_text())["flags"]
    fitted = set(flags["step_ms"]) | set(flags["programs"])
    assert fitted, "a table without the models its flag sets were picked on"
    assert fitted <= set(MODELS)
    assert not fitted & set(HELD_OUT)


def _row(model, scheme, system, step_ms, peak_mb, profile=None):
    row = {"model": model, "scheme": scheme, "system": system, "status": "ok", "step_ms": step_ms, "peak_mb": peak_mb}
    return {**row, "profile": profile} if profile else row


# Three planted models: pock-mlir ahead of the fastest peer on "a" (0.5x) and "b" (0.8x), behind
# on "c" (1.5x, where ONNX Runtime is the fastest peer and a failed JAX row must not count).
PLANTED = [
    _row("a", "full", "eager", 10.0, 100),
    _row("a", "full", "torch.compile", 8.0, 120),
    _row("a", "full", "pock-mlir", 4.0, 50, {"dispatch_ms_per_step": 3.0, "by_kind": [{"kind": "mmt4d"}]}),
    _row("a", "sparse", "pock-mlir", 2.0, 40),
    _row("a", "full", "pock-mlir-deployed", 4.1, 30),
    _row("a", "sparse", "pock-mlir-deployed", 2.1, 20),
    _row("a", "sparse", "eager", 6.0, 80),
    _row("b", "full", "eager", 5.0, 60),
    _row("b", "full", "pock-mlir", 4.0, 50),
    _row("b", "sparse", "pock-mlir", 4.4, 45),
    _row("b", "full", "pock-mlir-deployed", 4.0, 70),
    _row("c", "full", "ort-training", 2.0, 30),
    _row("c", "full", "eager", 3.0, 40),
    {"model": "c", "scheme": "full", "system": "jax", "status": "failed: planted"},
    _row("c", "full", "pock-mlir", 3.0, 25),
    _row("c", "full", "pock-mlir-deployed", 3.0, 15),
]


def test_model_summary_of_planted_rows():
    a = model_summary(PLANTED, "a")
    assert a["fastest_peer"] == "torch.compile" and a["full_vs_fastest_peer"] == pytest.approx(0.5)
    assert a["sparse_vs_full"] == pytest.approx(0.5)
    assert a["deployed_memory_vs_lowest_peer"] == pytest.approx({"full": 0.3, "sparse": 0.25})
    assert a["dispatch_share"] == pytest.approx(0.75) and a["host_overhead_ms"] == pytest.approx(1.0)
    assert a["top_kind"] == "mmt4d"
    assert a["deployed_full_vs_fastest_peer"] == pytest.approx(4.1 / 8.0)
    c = model_summary(PLANTED, "c")
    assert c["fastest_peer"] == "ort-training" and c["full_vs_fastest_peer"] == pytest.approx(1.5)
    assert "sparse_vs_full" not in c and "dispatch_share" not in c


def test_distribution_of_planted_rows():
    dist = distribution([model_summary(PLANTED, m) for m in "abc"])
    full = dist["full_vs_fastest_peer"]
    assert dist["models_measured"] == 3
    assert full["median"] == pytest.approx(statistics.median([0.5, 0.8, 1.5])) and full["worst"] == pytest.approx(1.5)
    assert full["share_ahead"] == pytest.approx(2 / 3)
    deployed = dist["deployed_full_vs_fastest_peer"]
    assert deployed["median"] == pytest.approx(0.8) and deployed["worst"] == pytest.approx(1.5)
    assert dist["sparse_vs_full"] == pytest.approx({"median": 0.8, "worst": 1.1, "models": 2})
    assert dist["deployed_memory_vs_lowest_peer"]["worst"] == pytest.approx(70 / 60)
    assert dist["targets"] == {
        "ahead on >= 80%": False,
        "never worse than 1.25x": False,
        "sparse never slower than full": False,
        "deployed peak memory below every peer's": False,
    }


def test_sparse_over_full_is_over_the_full_step_of_the_sparse_rounds_and_a_sparse_full_step_is_apart():
    """The sparse rounds time pock-mlir's full step too (FULL_BESIDE): sparse over full is over that
    one. A sparse scheme that trains every parameter (trainable_params equal) is a full step: it is
    reported but left out of the sparse target."""
    rows = [
        {**_row("x", "full", "pock-mlir", 4.0, 50), "trainable_params": 100},
        {**_row("x", "sparse", "pock-mlir", 2.0, 40), "trainable_params": 10},
        {**_row("x", "sparse", FULL_BESIDE, 5.0, 50), "trainable_params": 100},
        {**_row("y", "full", "pock-mlir", 2.0, 50), "trainable_params": 60},
        {**_row("y", "sparse", "pock-mlir", 2.2, 50), "trainable_params": 60},
        {**_row("y", "sparse", FULL_BESIDE, 2.0, 50), "trainable_params": 60},
    ]
    x, y = model_summary(rows, "x"), model_summary(rows, "y")
    assert x["sparse_vs_full"] == pytest.approx(0.4) and not x["sparse_trains_all"]
    assert y["sparse_vs_full"] == pytest.approx(1.1) and y["sparse_trains_all"]
    dist = distribution([x, y])
    assert dist["sparse_vs_full"] == pytest.approx({"median": 0.4, "worst": 0.4, "models": 1})
    assert dist["targets"]["sparse never slower than full"] is True
    section = "\n".join(part_section("held-out", {"distribution": dist, "models": [x, y]}, {}))
    assert "| 1.10x (trains every parameter: not in the target) |" in section
    assert "over the 1 models whose sparse scheme freezes some parameters: median 0.40x, worst 0.40x" in section


def test_summarize_keeps_the_parts_apart():
    parts = summarize({"parts": {"fit": ["a"], "held-out": ["b", "c", "unmeasured"]}, "rows": PLANTED})
    assert [s["model"] for s in parts["fit"]["models"]] == ["a"]
    assert [s["model"] for s in parts["held-out"]["models"]] == ["b", "c"]
    assert parts["fit"]["distribution"]["targets"]["ahead on >= 80%"] is True
    assert parts["held-out"]["distribution"]["full_vs_fastest_peer"]["median"] == pytest.approx(1.15)


def test_as_an_unmeasured_cpu_the_bench_compiles_by_another_cpus_table():
    """--as-unmeasured-cpu: pock-mlir's compilations take the nearest other CPU's table (never this
    CPU's), the report says which, and its default directory is apart from this CPU's own runs."""
    from bench.held_out import _table_used, parse_args
    from bench.machine import runs_dir
    from pock_mlir.tuning import own_table_path, table_path

    args = parse_args(["--part", "held-out", "--models", "ho-edge-mlp", "--as-unmeasured-cpu"])
    assert args.tuning == str(table_path("host", others_only=True)) and Path(args.tuning) != own_table_path("host")
    assert Path(args.tuning).is_file() and args.out == runs_dir() / "unmeasured-cpu"
    said = _table_used({"own_table": True, "tuning": Path(args.tuning).name})
    assert said == f"shipped, but not used: as on a CPU without one, {Path(args.tuning).name} answered"
    assert parse_args(["--part", "held-out"]).tuning is None


def test_systems_are_a_subset_that_always_holds_pock_mlir():
    from bench.held_out import SYSTEMS, parse_args

    assert parse_args([]).systems == list(SYSTEMS)
    assert parse_args(["--systems", "executorch,eager"]).systems == ["eager", "executorch", "pock-mlir"]
    with pytest.raises(SystemExit):
        parse_args(["--systems", "eager,tensorflow"])


def test_a_held_out_run_as_an_unmeasured_cpu_writes_its_report_and_the_readmes_summary(tmp_path):
    """The README's command, on the smallest held-out model and one peer (each peer's own rows are
    test_bench*'s): the systems asked for and pock-mlir's sparse full step beside measured, pock-mlir's
    compilations by another CPU's table, and the summary the README quotes is the held-out part's."""
    from bench.held_out import main

    command = (
        "--part held-out --models ho-edge-mlp --systems ort-training,pock-mlir-deployed "
        "--steps 1 --rounds 1 --warmup 1 --as-unmeasured-cpu --out"
    )
    assert main([*command.split(), str(tmp_path)]) == 0
    results = json.loads((tmp_path / "held_out.json").read_text())
    assert {r["system"] for r in results["rows"]} == {"ort-training", "pock-mlir", "pock-mlir-deployed", FULL_BESIDE}
    assert all(r["status"] == "ok" for r in results["rows"]), [r["status"] for r in results["rows"]]
    compiled = [r for r in results["rows"] if r["system"] == "pock-mlir"]
    assert compiled and all(f"{results['machine']['tuning']}'" in r["tuning"] for r in compiled)  # by that table
    summary = (tmp_path / "held_out_summary.md").read_text()
    assert f"as on a CPU without one, {results['machine']['tuning']} answered" in summary
    assert "## held-out part: distribution" in summary and "| MLP 64-128-10, batch 1 |" in summary
    assert "## Rows" not in summary
    report = (tmp_path / "held_out.md").read_text()
    assert (
        f"FIT part (what the tuning tables, flag sets and heuristics were fitted on): not run in this report (its models: {', '.join(PARTS['fit'])})"
        in report
    )


def test_the_drivers_bench_steps_one_module_alike_on_both_cpu_drivers(tmp_path):
    """bench.drivers on the smallest held-out model: both drivers timed under both conditions, the
    two trainers' parameters the same after the same steps, and a second run keeps earlier rows."""
    from bench import drivers

    assert drivers.main(["--models", "ho-edge-mlp", "--steps", "5", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "drivers.json").read_text())
    row = results["rows"]["ho-edge-mlp"]
    assert row["max_parameter_difference"] <= 1e-6
    for state in (drivers.IDLE, drivers.ONE_CORE_BUSY):
        assert all(row[state][d]["step_ms_min"] > 0 for d in drivers.DRIVERS)
    results["rows"] = {"earlier": {**row, "model": "earlier"}}  # a row an earlier run wrote, of another model
    (tmp_path / "drivers.json").write_text(json.dumps(results))
    # the same model again: its step comes from the session's compile cache
    assert drivers.main(["--models", "ho-edge-mlp", "--steps", "5", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "drivers.md").read_text()
    assert "| earlier |" in table and "| ho-edge-mlp |" in table
    with pytest.raises(SystemExit):
        drivers.main(["--models", "no-such-model", "--out", str(tmp_path)])


def test_the_fusion_sizes_bench_times_each_variant_on_each_driver_and_they_train_alike(tmp_path):
    """bench.fusion_sizes on the smallest size: fused and unfused steps, with either tails, on
    either driver, timed, their parameters the same after the same steps, and unknown sizes refused."""
    from bench import drivers, fusion_sizes

    assert fusion_sizes.main(["--models", "size-mlp-32x1", "--steps", "5", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "fusion_sizes.json").read_text())["rows"]["size-mlp-32x1"]
    assert row["max_parameter_difference"] <= 1e-6
    for driver in drivers.DRIVERS:
        for tails in fusion_sizes.PAIRS:
            assert row[driver][tails]["fused_vs_unfused"] > 0 and row[driver][tails]["unfused"]["step_ms_min"] > 0
    assert "| MLP 256-32-32-10, batch 1 | 0.16 |" in (tmp_path / "fusion_sizes.md").read_text()
    with pytest.raises(SystemExit):
        fusion_sizes.main(["--models", "ho-edge-mlp", "--out", str(tmp_path)])  # a held-out model: no size


def test_the_drivers_bench_puts_the_fit_part_in_the_cpus_table_and_judges_held_out_rows_by_it(tmp_path, monkeypatch):
    """A bench model's idle medians and FLOPs go into this CPU's table (here one in tmp_path), which
    the choice then reads; a held-out row is reported with the driver that table chooses for it."""
    from bench import drivers

    table = tmp_path / "host-this-cpu.json"
    table.write_text(json.dumps({"flags": {"programs": {}}}))  # another study's section stays
    monkeypatch.setattr(drivers, "own_table_path", lambda target: table)
    assert drivers.main(["--models", "mlp", "--steps", "5", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "drivers.json").read_text())["rows"]["mlp"]
    written = json.loads(table.read_text())
    assert written["flags"] == {"programs": {}}
    assert written["drivers"]["programs"] == {"mlp": row["flops"]} and row["flops"]["matmuls"] > 0
    medians = {d: row[drivers.IDLE][d]["step_ms_median"] for d in drivers.DRIVERS}
    assert written["drivers"]["step_ms"] == {"mlp": medians}
    # a held-out row is judged by the table's one program: its faster driver is the one chosen
    mlp_choice = "local-sync" if medians["local-sync"] <= 0.95 * medians["local-task"] else "local-task"
    for ratio, faster in [(0.5, "local-sync"), (2.0, "local-task")]:
        held_out = {**row, "model": "ho-edge-mlp", drivers.IDLE: {**row[drivers.IDLE], "sync_vs_task": ratio}}
        report = drivers.markdown({"cpu": "this", "cores": 2, "rows": {"ho-edge-mlp": held_out}})
        judged = "the faster" if mlp_choice == faster else "the slower"
        assert f"| {mlp_choice} ({judged}) |" in report, report
