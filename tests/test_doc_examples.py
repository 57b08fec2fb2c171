"""The guides' Python examples with library models (Hugging Face transformers, timm, torchvision,
PEFT) run as written in the venv `make` builds: each in a process of its own, which nothing of the
tests' own set-up (tests/conftest.py) reaches (#61)."""

import subprocess
import sys

from docs_blocks import doc_python


def run_in_a_plain_process(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=900)


def test_the_libraries_import_in_a_plain_process(tmp_path):
    """What the examples rest on: torchvision, timm, transformers and PEFT import and build a
    model, with no workaround in the process (the venv's own set-up: Makefile)."""
    code = (
        "import torchvision, timm, transformers, peft\n"
        "torchvision.models.mobilenet_v2(num_classes=10)\n"
        "timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=10)\n"
        "transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2))\n"
        "print('built')\n"
    )
    done = run_in_a_plain_process(code, tmp_path)
    assert done.returncode == 0 and done.stdout == "built\n", done.stderr[-2000:]


def test_the_library_models_block_runs_as_written(tmp_path):
    """docs/python-api.md's GPT-2 and MobileNetV2 block: both compile to a training step, GPT-2 with
    every parameter trained (no scheme), MobileNetV2 with the part mobilenet-last-4 names."""
    code = doc_python("docs/python-api.md", "## Losses, dropout and buffers")
    checks = (
        "\nfor program in (gpt2, mobilenet):\n"
        "    assert 'func.func @train_step' in program.ir('lowered')\n"
        "assert set(gpt2.signature.trainable) == {p.name for p in gpt2.signature.params}\n"
        "assert 0 < len(mobilenet.signature.trainable) < len(mobilenet.signature.params)\n"
        "print('ran')\n"
    )
    done = run_in_a_plain_process(code + checks, tmp_path)
    assert done.returncode == 0 and done.stdout.endswith("ran\n"), f"{code}\n{done.stderr[-3000:]}"
