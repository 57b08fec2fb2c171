"""ExecuTorch training as a bench peer: the MLP's program from bench/child.py's "executorch-export",
trained by its C++ SGD in bench/executorch_child.py's process, against torch.optim.SGD with
momentum (the MLP's optimizer) on the same weights and batch; what it cannot run said per model."""

import json

import pytest
from oracle import torch_trajectory

from bench.__main__ import TrainingChild, run_child
from bench.models import MODELS

WARMUP, STEPS = 1, 2  # with the round's untimed step, the reported loss is the 4th step's
TOLERANCE = 1e-5  # relative, on the loss
COMMON = {"model": "mlp", "scheme": "full", "warmup": WARMUP, "steps": STEPS}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The MLP's ExecuTorch program, exported once for the module's tests."""
    directory = tmp_path_factory.mktemp("executorch") / "mlp"
    row = run_child({**COMMON, "task": "executorch-export", "artifacts": str(directory)}, timeout=300)
    assert row["status"] == "ok", row["status"]
    return directory, row


def train(directory) -> dict:
    child = TrainingChild({**COMMON, "task": "executorch-run", "artifacts": str(directory)}, timeout=300)
    child.round()
    return child.finish()


def test_executorch_trains_the_mlp_like_torch_sgd(exported):
    directory, row = exported
    assert "optimizer_differs" not in row  # ExecuTorch's SGD has momentum: the MLP's own optimizer
    trained = train(directory)
    assert trained["status"] == "ok", trained["status"]
    assert trained["steps"] == STEPS and trained["step_ms"] > 0 and trained["peak_mb"] > 0

    model_def = MODELS["mlp"]
    module = model_def.build()
    inputs, target = model_def.batch()
    losses, _ = torch_trajectory(module, inputs, target, model_def.optimizer, WARMUP + 1 + STEPS)
    assert trained["trainable_params"] == row["trainable_params"] == sum(p.numel() for p in module.parameters())
    # the 4th loss follows three updates: matching it checks them, as they move it well beyond the tolerance
    assert abs(losses[-1] - losses[0]) > 10 * TOLERANCE * losses[0]
    assert trained["loss"] == pytest.approx(losses[-1], rel=TOLERANCE)


def test_executorch_losses_unlike_eagers_fail_the_row_before_timing(exported, tmp_path):
    directory, _ = exported
    wrong = tmp_path / "mlp"
    wrong.mkdir()
    for name in ("program.pte", "batch.npz"):
        (wrong / name).symlink_to(directory / name)
    training = json.loads((directory / "training.json").read_text())
    training["eager_losses"] = [loss * 1.01 for loss in training["eager_losses"]]
    (wrong / "training.json").write_text(json.dumps(training))
    row = train(wrong)
    assert row["status"].startswith("failed: RuntimeError: its losses differ from eager PyTorch's"), row["status"]
    assert "step_ms" not in row


def export_row(model: str, tmp_path) -> dict:
    """The row of exporting `model`'s full step for ExecuTorch."""
    spec = {**COMMON, "model": model, "task": "executorch-export", "artifacts": str(tmp_path / model)}
    return run_child(spec, timeout=300)


def test_executorch_says_it_cannot_run_a_1d_convolutions_backward(tmp_path):
    row = export_row("kws", tmp_path)
    assert (
        row["status"] == "not supported yet: ExecuTorch has no backward of 1-D (or 3-D) convolutions, only of 2-D ones"
    )


def test_executorch_says_which_op_its_edge_dialect_refuses(tmp_path):
    """timm's ConvNeXt: its joint graph holds aten.as_strided_scatter, outside the Core ATen opset
    ExecuTorch's to_edge takes."""
    row = export_row("ho-timm-convnext", tmp_path)
    assert row["status"] == (
        "not supported yet: ExecuTorch's to_edge: Operator torch._ops.aten.as_strided_scatter.default "
        "is not in Core ATen opset"
    ), row["status"]


def test_the_report_says_how_the_executorch_rows_were_made(tmp_path):
    from bench.report import write_markdown

    row = {"scheme": "full", "status": "ok", "step_ms": 1.0, "step_ms_min": 1.0, "peak_mb": 1.0, "loss": 2.0}
    results = {
        "date": "today",
        "machine": {"cpu": "cpu", "cores": 2, "threads": 2, "load_before": [0.0] * 3, "load_after": [0.0] * 3},
        "settings": {"steps": 1, "warmup": 1, "pock_iree_flags": [], "models": {}},
        "rows": [
            {**row, "model": "mlp", "system": "executorch", "executorch": "1.5.1"},
            {**row, "model": "tiny-vit", "system": "executorch", "executorch": "1.5.1", "optimizer_differs": "SGD"},
            {"model": "kws", "scheme": "full", "system": "executorch", "status": "not supported yet: no 1-D"},
        ],
    }
    write_markdown(results, tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "| mlp | full | ExecuTorch training |  | 1.00 |" in text
    assert "| kws | full | ExecuTorch training |  | not supported yet: no 1-D |" in text
    assert "ExecuTorch training (executorch 1.5.1)" in text and "its tiny-vit rows take SGD" in text
