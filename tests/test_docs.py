"""README.md and docs/*.md: every command block is run by a test (the Python ones here, against
PyTorch), every link leads somewhere, and the README stays a front door."""

import copy
import re

import numpy as np
import pytest
import torch
from docs_blocks import REPO, RUNNABLE, blocks, doc_commands, doc_python, pages
from oracle import assert_gradients_close, assert_trajectory_close, torch_gradients, torch_trajectory

import pock_mlir as pock

READS = re.compile(r'doc_(?P<kind>commands|python)\(\s*"(?P<page>[^"]+)",\s*"(?P<heading>[^"]+)"\s*\)')
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def sections_read_by_tests() -> set[tuple[str, str, str]]:
    read = set()
    for test in (REPO / "tests").glob("*.py"):
        for m in READS.finditer(test.read_text()):
            read.add((m.group("page"), m.group("heading"), "sh" if m.group("kind") == "commands" else "python"))
    return read


def test_every_command_block_is_run_by_a_test():
    read = sections_read_by_tests()
    unrun = [
        f"{b.page}:{b.line} ```{b.lang} under {b.heading!r}"
        for page in pages()
        for b in blocks(page)
        if b.lang in RUNNABLE and (b.page, b.heading, b.lang) not in read
    ]
    assert not unrun, (
        "blocks no test runs (run them with tests/docs_blocks.py's doc_commands/doc_python, "
        "or mark output and formats as ```text): " + "; ".join(unrun)
    )
    untyped = [f"{b.page}:{b.line}" for page in pages() for b in blocks(page) if not b.lang]
    assert not untyped, f"blocks without a language (```sh, ```python, ```text, ...): {', '.join(untyped)}"
    other_shells = [
        f"{b.page}:{b.line} ```{b.lang}"
        for page in pages()
        for b in blocks(page)
        if b.lang in ("bash", "shell", "console", "py", "python3")
    ]
    assert not other_shells, f"commands are ```sh or ```python blocks: {', '.join(other_shells)}"


def test_every_section_a_test_reads_exists():
    have = {(b.page, b.heading, b.lang) for page in pages() for b in blocks(page)}
    assert not sections_read_by_tests() - have


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


def test_links_lead_to_files_and_headings():
    broken = []
    notes = [str(p.relative_to(REPO)) for p in sorted((REPO / "bench" / "runs").glob("*/NOTES.md"))]
    for page in pages() + notes:
        text = (REPO / page).read_text()
        for m in LINK.finditer(text):
            target = m.group("target")
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (REPO / page).parent / path if path else REPO / page
            if not file.exists():
                broken.append(f"{page}: {target}")
            elif anchor and file.suffix == ".md":
                headings = {slug(line) for line in file.read_text().splitlines() if line.startswith("#")}
                if anchor not in headings:
                    broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "; ".join(broken)


def test_readme_is_a_front_door():
    assert len((REPO / "README.md").read_bytes()) <= 25 * 1024


def run_as_written(source: str, name: str) -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(source, name, "exec"), namespace)
    return namespace


def test_setup_block_is_what_ci_runs():
    """The README's set-up commands are the ones .ci/run runs on a clean clone (which makes the venv
    every other block runs in), in the same order."""
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = doc_commands("README.md", "## Set-up")
    assert sorted(commands) == ["make demo", "make test"]
    assert [c for c in ci if c in commands] == ["make test", "make demo"]


def test_readme_example_trains_as_torch_optim():
    ns = run_as_written(doc_python("README.md", "## Example"), "README.md")
    assert_trajectory_close(
        ns["losses"],
        ns["trainer"].state_dict(),
        ns["model"],
        ns["inputs"],
        ns["target"],
        pock.SGD(lr=0.1, momentum=0.9),
        20,
        trainable={"0.bias", "2.bias", "4.weight", "4.bias"},
    )
    assert "4 of 6 parameters trained" in str(ns["program"].report())


def test_python_api_guide_against_pytorch():
    ns = run_as_written(doc_python("docs/python-api.md", "## A program and its trainer"), "docs/python-api.md")
    model, inputs, target = ns["model"], ns["inputs"], ns["target"]
    trained = {"2.weight", "2.bias"}
    # The guide took one step, then read gradients, outputs and the loss at the updated weights.
    _, stepped = torch_trajectory(model, inputs, target, pock.SGD(lr=0.1, momentum=0.9), 1, trainable=trained)
    assert_gradients_close(ns["weights"], stepped, what="weights after one step")
    later = copy.deepcopy(model)
    later.load_state_dict({name: torch.from_numpy(value) for name, value in stepped.items()})
    want_loss, want_grads = torch_gradients(later, inputs, target, trainable=trained)
    assert ns["loss"] == pytest.approx(want_loss, rel=1e-5) and ns["val_loss"] == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(ns["grads"], want_grads)
    np.testing.assert_allclose(ns["outputs"], later(inputs).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert set(ns["moments"]) == {"2.weight.momentum_buffer", "2.bias.momentum_buffer", "step"}
    assert "func.func @train_step" in ns["lowered"]


def test_front_door_links_every_guide():
    index = (REPO / "docs" / "README.md").read_text()
    guides = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    assert [g for g in guides if f"({g})" not in index] == []
