"""Runs the lit suite once per session and reports each lit file as its own pytest test."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIT_DIR = ROOT / "lit_tests"
LIT_FILES = sorted(p.relative_to(LIT_DIR).as_posix() for p in LIT_DIR.rglob("*.mlir") if "Output" not in p.parts)


@pytest.fixture(scope="session")
def lit_results(tmp_path_factory):
    report = tmp_path_factory.mktemp("lit") / "results.xml"
    lit = Path(sys.executable).parent / "lit"
    subprocess.run([str(lit), "-q", "-j", str(os.cpu_count() or 2), f"--xunit-xml-output={report}", str(LIT_DIR)],
                   cwd=ROOT, capture_output=True, text=True)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        failure = case.find("failure")
        results[name] = None if failure is None else (failure.text or "failed")
    return results


@pytest.mark.parametrize("lit_file", LIT_FILES)
def test_lit(lit_results, lit_file):
    matches = [name for name in lit_results if name.endswith(lit_file)]
    assert matches, f"lit did not run {lit_file}"
    failure = lit_results[matches[0]]
    assert failure is None, f"{lit_file} failed:\n{failure}"
