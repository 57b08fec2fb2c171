"""The benchmark harness end to end in --quick mode on the MLP: it measures every system in its
own process, in interleaved rounds, and writes a valid results.json, results.md and results.png.
No timing assertions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--steps", "3", "--warmup", "1", "--rounds", "2",
                           "--systems", "eager,pock-mlir", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, json.loads((out / "results.json").read_text())


def test_every_row_measured(results):
    _, data = results
    rows = {(r["model"], r["scheme"], r["system"]): r for r in data["rows"]}
    assert set(rows) == {("mlp", s, system) for s in ("full", "sparse") for system in ("eager", "pock-mlir")}
    for key, row in rows.items():
        assert row["status"] == "ok", (key, row["status"])
        assert row["steps"] == 3 and row["rounds"] == 2 and row["step_ms"] > 0 and row["peak_mb"] > 0, key
    # both systems train the same model from the same weights on the same batch
    for scheme in ("full", "sparse"):
        assert rows["mlp", scheme, "pock-mlir"]["loss"] == pytest.approx(rows["mlp", scheme, "eager"]["loss"], rel=1e-4)
    assert rows["mlp", "sparse", "pock-mlir"]["speedup_vs_own_full"] > 0
    assert rows["mlp", "full", "eager"]["flops"] > 0 and rows["mlp", "full", "pock-mlir"]["gflops"] > 0
    assert data["machine"]["peak_gflops"] > 0 and len(data["machine"]["load_before"]) == 3
    assert any("--iree-llvmcpu-target-cpu=host" in f for f in data["settings"]["pock_iree_flags"])


def test_markdown_table_and_targets(results):
    out, _ = results
    text = (out / "results.md").read_text()
    assert "| model | scheme | system | step ms | fastest step ms | speed-up vs eager full |" in text
    assert "| MLP" in text and "pock-mlir" in text and "PyTorch eager" in text
    assert "## Targets" in text and "ratio of fastest steps" in text and "Machine load:" in text


def test_plot_is_a_png(results):
    out, _ = results
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_child_that_fails_becomes_a_row_with_its_error(tmp_path):
    from bench.__main__ import TrainingChild

    child = TrainingChild({"task": "pock-run", "model": "mlp", "scheme": "full", "warmup": 1, "steps": 1,
                           "program": str(tmp_path / "missing.pickle")}, timeout=120)
    child.round()  # a failed child ignores the round
    status = child.finish()["status"]
    assert status.startswith("failed: FileNotFoundError") and "missing.pickle" in status
