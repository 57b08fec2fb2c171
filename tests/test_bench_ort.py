"""ONNX Runtime training as a bench peer: the MLP's artifacts from bench/child.py's "ort-export",
trained in bench/ort_child.py's process (which must never import torch), against torch.optim.SGD
(ONNX Runtime's SGD has no momentum) on the same weights and batch."""

import pytest
from oracle import torch_trajectory

import pock_mlir as pock
from bench.__main__ import TrainingChild, run_child
from bench.models import MODELS, scheme_spec, trainable_names

WARMUP, STEPS = 1, 2  # with the round's untimed step, the reported loss is the 4th step's
TOLERANCE = 1e-5  # relative, on the loss


def torch_sgd_losses(scheme: str, steps: int) -> tuple[list[float], int]:
    """The losses of `steps` plain SGD steps on the scheme's trainable parameters, and their element count."""
    model_def = MODELS["mlp"]
    module = model_def.build()
    inputs, target = model_def.batch()
    trainable = trainable_names(scheme_spec(model_def, scheme)[0], module)
    losses, _ = torch_trajectory(
        module, inputs, target, pock.SGD(lr=model_def.optimizer.lr), steps, trainable=trainable
    )
    return losses, sum(p.numel() for name, p in module.named_parameters() if name in trainable)


def torch_free_round(spec: dict, timeout: float) -> dict:
    """The row of a child that must run without torch, after one round of timed steps."""
    child = TrainingChild(spec, timeout=timeout)
    child.round()
    row = child.finish()
    assert row["status"] == "ok", row["status"]
    assert row["torch_loaded"] is False
    return row


@pytest.mark.parametrize("scheme", ["full", "sparse"])
def test_ort_trains_the_mlp_like_torch_sgd_without_torch(scheme, tmp_path):
    common = {"model": "mlp", "scheme": scheme, "warmup": WARMUP, "steps": STEPS}
    exported = run_child({**common, "task": "ort-export", "artifacts": str(tmp_path / "mlp")}, timeout=120)
    assert exported["status"] == "ok", exported["status"]
    assert "momentum" in exported["optimizer_differs"]  # the MLP's optimizer is momentum SGD: the report says so
    trained = torch_free_round(
        {**common, "task": "ort-run", "artifacts": str(tmp_path / "mlp"), "learning_rate": exported["learning_rate"]},
        timeout=120,
    )
    assert trained["steps"] == STEPS and trained["step_ms"] > 0 and trained["peak_mb"] > 0

    losses, trainable = torch_sgd_losses(scheme, WARMUP + 1 + STEPS)
    assert trained["trainable_params"] == trainable  # the scheme's frozen parameters stay frozen
    # the 4th loss follows three updates: matching it checks them, as they move it well beyond the tolerance
    assert abs(losses[-1] - losses[0]) > 10 * TOLERANCE * losses[0]
    assert trained["loss"] == pytest.approx(losses[-1], rel=TOLERANCE)
