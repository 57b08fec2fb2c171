"""README.md and docs/*.md quote the result tables the scripts write (bench/, examples/quality/), the
pipeline of pock_mlir/stages.py, the targets of pock_mlir/targets.py and a summary of
bench/results.json, each generated, never typed."""

import importlib.util
import json
import re
from pathlib import Path

from pock_mlir.stages import STAGE_PIPELINES
from pock_mlir.targets import TARGETS, resolve_target, vector_tails

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
readme_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_results)


def quoted_by(page: str) -> list[str]:
    return [m.group("path") for m in readme_results.BLOCK.finditer((ROOT / page).read_text())]


def test_every_generated_block_is_quoted_and_none_is_stale():
    assert quoted_by("README.md") == [
        "pipeline",
        "bench/runs/amd-epyc-25-17/unmeasured-cpu-with-executorch/held_out_summary.md",
        "bench-summary",
    ]
    assert quoted_by("docs/architecture.md") == ["pipeline"]
    assert quoted_by("docs/benchmarks.md") == ["bench/results.md"]
    assert quoted_by("docs/quality.md") == [
        f"examples/quality/results/{name}.md" for name in ("vision", "language", "text", "vision_seeds")
    ]
    assert quoted_by("docs/federated.md") == ["examples/quality/results/federated.md"]
    assert quoted_by("docs/targets-and-deploying.md") == ["targets"]
    stale = {page.name: readme_results.stale_blocks(page.read_text()) for page in readme_results.pages()}
    assert not any(stale.values()), f"run `python tools/readme_results.py`: {stale}"


def test_the_pipeline_figure_lists_every_pass_in_order():
    figure = readme_results.pipeline_figure()
    for stage, pipeline in STAGE_PIPELINES.items():
        chain = figure[figure.index(f"{stage}:") + len(stage) + 1 :].split("─▶")[0]
        assert chain.split() == " ▸ ".join(p.split("{")[0] for p in pipeline.split(",")).split(), stage


def test_the_targets_table_has_each_target_with_the_flags_it_compiles_with():
    rows = readme_results.targets_table().splitlines()[2:]
    assert len(rows) == len(TARGETS)
    for row, kind in zip(rows, TARGETS.values()):
        usage, default, flags, drivers = row.strip("| ").replace("\\|", "|").split(" | ")
        target, shown = resolve_target(kind.name), set(re.findall(r"`(--[^`]+)`", flags))
        assert (usage, default) == (f"`{kind.usage()}`", target.description)
        # host's are this machine's, and x86-64's vector-tail flag, whichever machine this is
        extra = set(vector_tails("x86_64")) if kind.name == "host" else set()
        assert set(target.compile_flags()) <= shown <= set(target.compile_flags()) | extra, kind.name
        assert drivers == ", ".join(f"`{d}`" for d in kind.drivers)


def test_the_bench_summary_reads_the_rows_it_names():
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    rows = {(r["model"], r["scheme"], r["system"]): r for r in results["rows"] if r["status"] == "ok"}
    summary = readme_results.bench_summary().splitlines()
    title = results["settings"]["models"]["mlp"]
    (line,) = [line for line in summary if line.startswith(f"| {title} |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    fastest = min(
        (rows["mlp", "full", p]["step_ms"], name)
        for p, name in readme_results.PEERS.items()
        if ("mlp", "full", p) in rows
    )
    assert cells == [
        title,
        f"{rows['mlp', 'full', 'pock-mlir']['step_ms']:.2f}",
        f"{fastest[0]:.2f} ({fastest[1]})",
        f"{rows['mlp', 'sparse', 'pock-mlir']['step_ms']:.2f}",
        f"{rows['mlp', 'full', 'pock-mlir-deployed-ort-optimizer']['peak_mb']:.1f}",
        f"{rows['mlp', 'full', 'ort-training']['peak_mb']:.1f}",
    ]
    assert len(summary) == 4 + len(results["settings"]["models"])


def test_refresh_replaces_only_the_block_and_demotes_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- results: bench/results.md -->\nold numbers\n<!-- results:end -->\noutro\n")
    assert readme_results.main(["--check", "--page", str(page)]) == 1
    assert readme_results.main(["--page", str(page)]) == 0
    text = page.read_text()
    body = (ROOT / "bench" / "results.md").read_text()
    assert text.startswith("intro\n<!-- results: bench/results.md -->\n### ")
    assert text.endswith("<!-- results:end -->\noutro\n")
    assert "old numbers" not in text and body.splitlines()[2] in text
    assert readme_results.main(["--check", "--page", str(page)]) == 0
