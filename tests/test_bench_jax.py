"""JAX as a bench peer: the tiny LLaMA-like decoder exported by bench/child.py's "jax-export",
trained by the port in bench/jax_child.py in a process that never imports torch, against
torch.optim.AdamW on the same weights, batch and trained parameters."""

import pytest
from oracle import torch_trajectory
from test_bench_ort import torch_free_round

from bench.__main__ import run_child
from bench.models import MODELS, scheme_spec, trainable_names

MODEL = "tiny-llama"
WARMUP, STEPS = 1, 2  # with the round's untimed step, the reported loss is the 4th step's
TOLERANCE = 1e-5  # relative, on the loss


@pytest.mark.parametrize("scheme", ["full", "sparse"])
def test_jax_port_trains_the_decoder_like_torch_without_torch(scheme, tmp_path):
    common = {"model": MODEL, "scheme": scheme, "warmup": WARMUP, "steps": STEPS}
    exported = run_child({**common, "task": "jax-export", "artifacts": str(tmp_path / "jax")}, timeout=120)
    assert exported["status"] == "ok", exported["status"]
    trained = torch_free_round({**common, "task": "jax-run", "artifacts": str(tmp_path / "jax")}, timeout=180)
    assert trained["steps"] == STEPS and trained["step_ms"] > 0 and trained["peak_mb"] > 0

    model_def = MODELS[MODEL]
    module = model_def.build()
    inputs, target = model_def.batch()
    names = trainable_names(scheme_spec(model_def, scheme)[0], module)
    losses, _ = torch_trajectory(
        module, inputs, target, model_def.optimizer, WARMUP + 1 + STEPS, loss=model_def.loss, trainable=names
    )
    assert (
        trained["trainable_params"]
        == exported["trainable_params"]
        == sum(p.numel() for n, p in module.named_parameters() if n in names)
    )
    # the 4th loss follows three updates: matching it checks them, as they move it well beyond the tolerance
    assert abs(losses[-1] - losses[0]) > 10 * TOLERANCE * losses[0]
    assert trained["loss"] == pytest.approx(losses[-1], rel=TOLERANCE)
