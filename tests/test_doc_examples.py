"""The documentation's Python examples with library models (Hugging Face transformers, timm,
torchvision, PEFT) run as written in the venv `make` builds: each in a process of its own, which
nothing of the tests' own set-up (tests/conftest.py) reaches (#61)."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md"]  # the files whose examples run here
LIBRARIES = ("transformers", "timm", "torchvision", "peft")
# What the examples take as imported (the Python API's first block imports pock_mlir as pock).
PRELUDE = "import torch\nimport torch.nn.functional as F\nimport pock_mlir as pock\n"


def python_blocks(document: str) -> list[str]:
    """The ```python blocks of a markdown file, dedented (a block in a list item is indented)."""
    text = (REPO / document).read_text()
    return [textwrap.dedent(m.group(2)) for m in re.finditer(r"^([ \t]*)```python\n(.*?)^\1```", text, re.M | re.S)]


def library_examples(document: str) -> list[str]:
    uses_a_library = re.compile(rf"^\s*(from|import) ({'|'.join(LIBRARIES)})\b", re.M)
    return [block for block in python_blocks(document) if uses_a_library.search(block)]


def run_example(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PRELUDE + code], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


def test_the_libraries_import_in_a_plain_process(tmp_path):
    """What the examples rest on: torchvision, timm, transformers and PEFT import and build a
    model, with no workaround in the process (the venv's own set-up: Makefile)."""
    code = ("import torchvision, timm, transformers, peft\n"
            "torchvision.models.mobilenet_v2(num_classes=10)\n"
            "timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=10)\n"
            "transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2))\n"
            "print('built')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout == "built\n", done.stderr[-2000:]


EXAMPLES = [(document, i) for document in DOCUMENTS for i in range(len(library_examples(document)))]


def test_the_documents_show_library_examples():
    assert EXAMPLES, f"no Python example in {', '.join(DOCUMENTS)} imports any of {', '.join(LIBRARIES)}"


@pytest.mark.parametrize("document, index", EXAMPLES)
def test_a_library_example_runs_as_written(document, index, tmp_path):
    code = library_examples(document)[index]
    done = run_example(code + "\nprint('ran')\n", tmp_path)
    assert done.returncode == 0 and done.stdout.endswith("ran\n"), f"{document}:\n{code}\n{done.stderr[-3000:]}"
