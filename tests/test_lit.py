"""Runs the lit suite once per session and reports each lit file as its own pytest test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIT_DIR = ROOT / "lit_tests"
# lit.cfg.py excludes "Output" (lit's own) and "inputs" (files other tests' RUN lines read)
LIT_FILES = sorted(
    p.relative_to(LIT_DIR).as_posix() for p in LIT_DIR.rglob("*.mlir") if not {"Output", "inputs"} & set(p.parts)
)


@pytest.fixture(scope="session")
def lit_results(tmp_path_factory):
    # lit's JSON report names each test by its path in the suite ("pock-mlir :: dialect/ops.mlir"),
    # as LIT_FILES does; the xunit report splits that path and mangles its dots.
    report = tmp_path_factory.mktemp("lit") / "results.json"
    lit = Path(sys.executable).parent / "lit"
    subprocess.run(
        [str(lit), "-q", "-j", str(os.cpu_count() or 2), f"--output={report}", str(LIT_DIR)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    results = {}
    for test in json.loads(report.read_text())["tests"]:
        path = test["name"].split(" :: ", 1)[1]
        results[path] = None if test["code"] in ("PASS", "XFAIL") else test["output"]
    return results


@pytest.mark.parametrize("lit_file", LIT_FILES)
def test_lit(lit_results, lit_file):
    assert lit_file in lit_results, f"lit did not run {lit_file}"
    failure = lit_results[lit_file]
    assert failure is None, f"{lit_file} failed:\n{failure}"
