"""The quality scripts (examples/quality) in their quick modes: every stage runs on a few of the
schemes. A file of its own so that `make test`'s two workers share the long example runs."""

import json
import sys

import pytest

from test_examples import REPO, run


@pytest.mark.parametrize("task, schemes", [("vision", 3), ("language", 3)])
def test_quality_script_quick(task, schemes, tmp_path):
    done = run([sys.executable, REPO / "examples" / "quality" / f"{task}.py", "--quick", "--out", tmp_path], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / f"{task}.json").read_text())["results"]
    assert len(results) == schemes and (tmp_path / f"{task}.png").stat().st_size > 0
    # the metric against device memory, for the runs that have it (pock-mlir's)
    assert (tmp_path / f"{task}_memory.png").stat().st_size > 0
    assert all((r.get("device_mb") or 0) > 0 for name, r in results.items() if not name.startswith("pytorch"))
    table = (tmp_path / f"{task}.md").read_text()
    assert all(f"| {name} |" in table for name in results)


def test_quick_quality_run_never_overwrites_the_quoted_results(tmp_path):
    results = REPO / "examples" / "quality" / "results"
    done = run([sys.executable, REPO / "examples" / "quality" / "vision.py", "--quick", "--out", results], tmp_path)
    assert done.returncode == 2 and "would overwrite the results the README quotes" in done.stderr
