"""pock-factor-reductions in the compiler's pipeline: a batch norm's backward sums its activations
twice, not four times (the gradients against autograd: test_rules_cnn, test_models_cnn)."""

import re

import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.stages import pipelines_without


def activation_sums(program) -> int:
    """Sums over the [2, 8, 6, 6] activations in the lowered train step."""
    step = re.search(r"func\.func @train_step\(.*?\n  \}", program.ir("lowered"), re.S).group(0)
    return len(re.findall(r"torch\.aten\.sum\.dim_IntList .*: !torch\.vtensor<\[2,8,6,6\],f32>", step))


def test_a_batch_norm_backward_sums_its_activations_twice():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(), nn.Flatten(), nn.Linear(288, 3)
    )
    x, y = torch.randn(2, 4, 6, 6), torch.tensor([0, 2])
    assert activation_sums(pock.compile_training(model, x, y, loss="cross_entropy", functions=())) == 2
    assert (
        activation_sums(
            pock.compile_training(
                model, x, y, loss="cross_entropy", functions=(), pipelines=pipelines_without("pock-factor-reductions")
            )
        )
        == 4
    )
