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


def test_the_onnx_file_rows_train_the_mlp_file_alike_in_both_runtimes(tmp_path):
    """The ONNX file's rows on the MLP: ONNX Runtime's generate_artifacts and pock.from_ort_recipe
    train one .onnx file, each in a process without torch; both losses are torch.optim's plain SGD
    steps on the PyTorch model (ONNX Runtime's SGD has no momentum), the pair is reported once their
    warm-up losses agree, and results.md has their table."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "bench"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--systems",
            "ort-training-onnx,pock-mlir-onnx",
            *("--warmup", str(WARMUP), "--steps", str(STEPS), "--rounds", "1", "--out", str(out)),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {(r["scheme"], r["system"]): r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {(s, system) for s in ("full", "sparse") for system in ("ort-training-onnx", "pock-mlir-onnx")}
    for scheme in ("full", "sparse"):
        losses, trainable = torch_sgd_losses(scheme, WARMUP + 1 + STEPS)
        ort, pock_row = rows[scheme, "ort-training-onnx"], rows[scheme, "pock-mlir-onnx"]
        for row in (ort, pock_row):
            assert row["status"] == "ok", row["status"]
            assert row["torch_loaded"] is False and row["trainable_params"] == trainable
            assert row["same_losses"]["steps"] == WARMUP and row["same_losses"]["rel_tolerance"] == 1e-4
            # the MLP's float32 trajectory stays by float64's: the relative bound decides, not the stray
            assert len(row["float32_strays"]) == WARMUP
            assert all(20 * stray < 1e-4 * bound_loss for stray, bound_loss in zip(row["float32_strays"], losses))
            assert row["loss"] == pytest.approx(losses[-1], rel=TOLERANCE)
        assert pock_row["loss"] == pytest.approx(ort["loss"], rel=TOLERANCE)
    text = (out / "results.md").read_text()
    assert "## ONNX files" in text and "| MLP 256-512-512-10, batch 64 | sparse (bias-only) | 1,034 |" in text
    assert "| model | scheme | system |" not in text  # no other system ran: no table of them, no targets


def test_the_onnx_file_rows_fail_when_their_losses_differ():
    from bench.__main__ import check_same_losses

    def rows(second):
        return {
            "ort-training-onnx": {"status": "ok", "warmup_losses": [2.3, 2.2, 2.1]},
            "pock-mlir-onnx": {"status": "ok", "warmup_losses": second},
        }

    same = rows([2.3, 2.2 * (1 + 5e-5), 2.1])
    check_same_losses(same)
    assert [r["status"] for r in same.values()] == ["ok", "ok"]
    differ = rows([2.3, 2.2, 2.11])
    check_same_losses(differ)
    for row in differ.values():
        assert row["status"] == "failed: the two systems' losses on the same file differ (step 3: 2.1 against 2.11)"
    # where PyTorch's own float32 run strays from float64 (a trajectory that amplifies rounding),
    # each system may stray 10 times as far: the pair, 20 times
    chaotic = rows([2.3, 2.2, 2.11])
    for row in chaotic.values():
        row["float32_strays"] = [0.0, 1e-4, 5.1e-4]
    check_same_losses(chaotic)
    assert [r["status"] for r in chaotic.values()] == ["ok", "ok"]
    assert chaotic["pock-mlir-onnx"]["same_losses"]["bounds"][2] == pytest.approx(1.02e-2)
    beyond = rows([2.3, 2.2, 2.11])
    for row in beyond.values():
        row["float32_strays"] = [0.0, 1e-4, 4.9e-4]
    check_same_losses(beyond)
    assert beyond["ort-training-onnx"]["status"].startswith("failed: the two systems' losses on the same file differ")
    none = rows([])
    none["ort-training-onnx"]["warmup_losses"] = []
    check_same_losses(none)
    assert "give --warmup 1 or more" in none["pock-mlir-onnx"]["status"]


def test_the_onnx_file_rows_are_measured_as_a_pair(capsys):
    from bench.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--quick", "--systems", "eager,pock-mlir-onnx"])
    assert "give both ort-training-onnx and pock-mlir-onnx" in capsys.readouterr().err
