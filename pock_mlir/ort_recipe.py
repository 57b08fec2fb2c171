"""ONNX Runtime's training recipe, compiled by pock-mlir: `from_ort_recipe` takes the arguments of
onnxruntime.training.artifacts.generate_artifacts (1.19) with their meaning there and returns what
compile_training returns. docs/coming-from-onnx-runtime.md maps the rest of ORT's API.

ORT's meanings kept: requires_grad names the initializers trained; every other initializer keeps
its value (frozen_params are ORT's checkpointed frozen parameters, the others its graph constants:
both are frozen here); a name in both lists is an error. The losses are ORT's blocks, each a mean
over the graph's first output (ORT passes every graph output to the loss; its blocks read the
first): CrossEntropyLoss (SoftmaxCrossEntropyLoss, class dimension 1, int labels), MSELoss,
BCEWithLogitsLoss and L1Loss. The optimizers are ORT's with its defaults: AdamW as ORT computes it
(pock.OrtAdamW: betas 0.9, 0.999, eps 1e-6, no weight decay) and SGD (no momentum); `lr` is what
ORT's Optimizer.set_learning_rate sets (ORT's default 0.001).
"""

from __future__ import annotations

import torch.nn.functional as F

from pock_mlir.compiler import compile_training
from pock_mlir.onnx_frontend import load_onnx, onnx_parameter_shapes
from pock_mlir.optim import SGD, OrtAdamW
from pock_mlir.sparse import SparseConfigError, SparseUpdate

ORT_LOSSES = {
    "CrossEntropyLoss": "cross_entropy",
    "MSELoss": "mse",
    "BCEWithLogitsLoss": lambda output, target: F.binary_cross_entropy_with_logits(output, target),
    "L1Loss": lambda output, target: F.l1_loss(output, target),
}
ORT_OPTIMIZERS = {
    "AdamW": lambda lr, options: OrtAdamW(lr=lr, **options),
    "SGD": lambda lr, options: SGD(lr=lr, **options),
}


def _enum_name(value, what: str, choices) -> str:
    """ORT's LossType/OptimType member or its name (ORT need not be installed)."""
    name = getattr(value, "name", value)
    if name not in choices:
        raise ValueError(f"{what}={value!r}: ONNX Runtime's are {', '.join(choices)}")
    return name


def _exact(name: str) -> str:
    """A sparse-scheme pattern matching `name` alone (fnmatch's special characters escaped)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def from_ort_recipe(
    model,
    example_inputs,
    example_target,
    *,
    requires_grad,
    frozen_params=None,
    loss="CrossEntropyLoss",
    optimizer="AdamW",
    lr: float = 1e-3,
    optimizer_options: dict | None = None,
    **compile_options,
):
    """compile_training of the ONNX model (an .onnx path or onnx.ModelProto) as ONNX Runtime's
    generate_artifacts(model, requires_grad, frozen_params, loss, optimizer) trains it, then
    Optimizer.set_learning_rate(lr). loss: a LossType or its name; optimizer: an OptimType or its
    name; optimizer_options: AdamW's betas, eps, weight_decay (ORT's AdamW block's arguments);
    compile_options: compile_training's (target, output, ...)."""
    loss_name = _enum_name(loss, "loss", ORT_LOSSES)
    optimizer_name = _enum_name(optimizer, "optimizer", ORT_OPTIMIZERS)
    proto = load_onnx(model)
    parameters = onnx_parameter_shapes(proto)
    initializers = {i.name for i in proto.graph.initializer}
    trained, frozen = list(requires_grad or []), list(frozen_params or [])
    both = sorted(set(trained) & set(frozen))
    if both:
        raise SparseConfigError(f"{', '.join(both)}: a parameter cannot be frozen and require gradient at once")
    unknown = [n for n in trained + frozen if n not in initializers]
    if unknown:
        raise SparseConfigError(f"{', '.join(unknown[:3])}: no initializer of the ONNX model has this name")
    not_float = [n for n in trained if n not in parameters]
    if not_float:
        raise SparseConfigError(
            f"{', '.join(not_float[:3])}: requires_grad names initializers that are no float tensor"
        )
    if not trained:
        raise SparseConfigError("requires_grad names no initializer: there is nothing to train")
    return compile_training(
        proto,
        example_inputs,
        example_target,
        loss=ORT_LOSSES[loss_name],
        optimizer=ORT_OPTIMIZERS[optimizer_name](lr, dict(optimizer_options or {})),
        sparse=SparseUpdate(rules=[(_exact(n), "full") for n in trained], default="frozen"),
        **compile_options,
    )
