"""Every script under examples/ as a user runs it: the model files' own commands (pock-compile, the
data, one pock-train epoch), --help everywhere, and the whole-path scripts in their quick modes.
`make demo` (examples/demo.py) runs in CI after the tests (.ci/run)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pock_mlir.tools.pock_compile import load_model_file

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MODEL_FILES = sorted(
    p.name
    for p in (REPO / "examples").glob("*.py")
    if "def example_batch(" in p.read_text() and p.name != "llama_text.py"
)  # llama_text.py's own run: tests/test_readme_commands.py (the LLM guide's block)
SCRIPTS = sorted(
    str(p.relative_to(REPO)) for p in (REPO / "examples").rglob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


def run(command: list, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(list(map(str, command)), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def docstring_commands(name: str) -> list[list[str]]:
    """The commands a model file's docstring shows (pock-compile, the data, pock-train), with
    pock-train cut to one epoch."""
    text = (REPO / "examples" / name).read_text()
    doc = text[text.index('"""') + 3 : text.index('"""', 3)]
    commands = [
        shlex.split(line.split("#")[0])
        for line in doc.splitlines()
        if line.strip().startswith(("pock-compile ", "pock-train ", "python examples/"))
    ]
    assert [c[0] for c in commands] == ["pock-compile", "python", "pock-train"], f"{name}: {commands}"
    train = commands[2]
    train[train.index("--epochs") + 1] = "1"
    return commands


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_file_commands(name, tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    compile_, data, train = docstring_commands(name)
    for command in (compile_, data, train):
        done = run(command, tmp_path)
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-3000:]}"
    losses = [float(x) for x in re.findall(r"epoch 1/1: loss ([0-9.naninf]+)", done.stdout)]
    assert len(losses) == 1 and np.isfinite(losses[0]), done.stdout
    bundle = tmp_path / compile_[compile_.index("-o") + 1]
    model = load_model_file(str(REPO / "examples" / name)).model
    model.load_state_dict(load_file(bundle / "tuned.safetensors"))  # strict: every name, every shape
    assert all(torch.isfinite(p).all() for p in model.state_dict().values() if p.is_floating_point())


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_writes_nothing(script, tmp_path):
    done = run([sys.executable, REPO / script, "--help"], tmp_path, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
