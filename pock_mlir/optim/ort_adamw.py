"""OrtAdamW: AdamW as ONNX Runtime's training computes it, for models that move from ORT's recipe
(pock_mlir/ort_recipe.py) and should train as they did there.

ORT 1.19's generate_artifacts builds its AdamWOptimizer node with adam_mode=1, Hugging Face's
AdamW: with t the step number, the update is lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m /
(sqrt(v) + eps), and the weight then decays by lr * weight_decay. torch.optim.AdamW (pock.AdamW)
adds eps to sqrt(v / (1 - beta2^t)) instead, and decays first, so the two differ where sqrt(v) is
near eps (an ORT model's eps of 1e-6 acts as torch's 1e-6 / sqrt(1 - beta2^t): 3e-5 at the first
step). ORT's defaults: eps 1e-6, no weight decay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pock_mlir.dialects.pock import OrtAdamWOp

from .adamw import adam_from_attributes, check_adam, emit_adam_update
from .registry import attribute, optimizer, update_op


@optimizer("ort_adamw")
@dataclass(frozen=True)
class OrtAdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.0

    def __post_init__(self):
        check_adam(self)

    state_slots = ("exp_avg", "exp_avg_sq")

    def emit(self, ip, loc, param, grad, state, step):
        """Create the update op; returns (new_param, [new_state...])."""
        return emit_adam_update(OrtAdamWOp, self, ip, loc, param, grad, state, step)


@update_op(OrtAdamWOp, state_slots=2, hyperparameters=lambda attributes: adam_from_attributes(OrtAdamW, attributes))
def lower_ort_adamw(b, op):
    param, grad, m, v, step = op.operands
    lr, beta1, beta2 = attribute(op, "lr"), attribute(op, "beta1"), attribute(op, "beta2")
    eps, wd = attribute(op, "eps"), attribute(op, "weight_decay")
    t = b.add(step, 1.0)
    new_m = b.add(b.mul(m, beta1), b.mul(grad, 1.0 - beta1))
    new_v = b.add(b.mul(v, beta2), b.mul(b.mul(grad, grad), 1.0 - beta2))
    # 1 - beta^t as -expm1(t ln beta), ln beta in double: ORT computes beta^t in double, and the
    # float32 1 - pow(0.999, t) loses 1e-5 of itself to cancellation (measured: the weights after
    # 4 steps 20 times further from a float64 run than ORT's)
    bias_correction1, bias_correction2 = (b.neg(b.aten.expm1(b.mul(t, math.log(beta)))) for beta in (beta1, beta2))
    step_size = b.div(b.mul(b.aten.sqrt(bias_correction2), lr), bias_correction1)
    updated = b.sub(param, b.mul(step_size, b.div(new_m, b.add(b.aten.sqrt(new_v), eps))))
    new_param = b.mul(updated, 1.0 - lr * wd) if wd else updated
    return [new_param, new_m, new_v]
