"""What sparse backpropagation saves: each parameter's policy, and the backward's cost with
every parameter trained in full ("full BP") next to the program's own ("sparse BP").

Both come from a training-stage module (pock.param, pock.grad; `program.ir("training")`).
For each, the function is cut down to its forward (the ancestors of the loss) and returns
the loss and the gradients, which the autodiff and sparse stage pipelines then expand:
full BP asks for the whole gradient of every pock.param, sparse BP for exactly the
pock.grad ops the module has (frozen parameters have none, channel-sparse ones the kept
rows). The backward is then every op the gradients need that the loss does not, constants
and list constructions aside; pock_mlir/cost.py counts its ops, FLOPs, saved activations and
parameter gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir
from torch_mlir.dialects import func

from pock_mlir.abi import TRAIN_STEP
from pock_mlir.context import make_context
from pock_mlir.cost import BackwardCost, GradientShares, ancestors, backward_cost, gradient_shares
from pock_mlir.dialects.pock import GradOp
from pock_mlir.op_facts import param_name
from pock_mlir.passes import run_pipeline
from pock_mlir.passes.base import function_named
from pock_mlir.stages import STAGE_PIPELINES
from pock_mlir.torch_types import tensor_type_of


class ReportError(ValueError):
    """The module is not a training-stage module the report can analyse."""


@dataclass(frozen=True)
class ParameterPolicy:
    name: str
    shape: tuple[int, ...]
    policy: str  # full | frozen | channels
    rows: int  # output channels updated: 0 when frozen, all of dim 0 when full

    def describe(self) -> str:
        if self.policy == "channels":
            return f"channels {self.rows}/{self.shape[0]}"
        return self.policy


@dataclass(frozen=True)
class Report:
    function: str
    parameters: list[ParameterPolicy]
    full: BackwardCost  # every parameter trained in full
    sparse: BackwardCost  # the scheme the module was built with
    scheme: str = ""
    unmatched: tuple[str, ...] = ()  # wildcard patterns of the scheme that matched nothing
    not_requiring_grad: tuple[str, ...] = ()  # parameters the model froze (requires_grad=False)

    def __str__(self) -> str:
        lines = [
            f"sparse backpropagation report: @{self.function}" + (f" (scheme: {self.scheme})" if self.scheme else "")
        ]
        width = max([len("parameter")] + [len(p.name) for p in self.parameters])
        lines.append(f"  {'parameter':<{width}}  {'shape':<14}  policy")
        for p in self.parameters:
            shape = "x".join(map(str, p.shape)) or "scalar"
            lines.append(f"  {p.name:<{width}}  {shape:<14}  {p.describe()}")
        trained = sum(p.policy != "frozen" for p in self.parameters)
        lines.append(f"  {trained} of {len(self.parameters)} parameters trained")
        if self.not_requiring_grad:
            lines.append(
                f"  {len(self.not_requiring_grad)} frozen by the model (requires_grad=False): "
                f"{', '.join(self.not_requiring_grad[:3])}{', ...' if len(self.not_requiring_grad) > 3 else ''}"
            )
        lines += [
            f"  warning: pattern '{pattern}' matches no parameter or module of this model" for pattern in self.unmatched
        ]
        lines.append("")
        lines.append(f"  {'backward':<21}{'full BP':>14}{'sparse BP':>14}{'saved':>9}")
        rows = [
            ("ops", "ops", ""),
            ("FLOPs", "flops", ""),
            ("saved activations", "saved_activation_bytes", " B"),
            ("parameter gradients", "gradient_bytes", " B"),
        ]
        for label, attr, unit in rows:
            before, after = getattr(self.full, attr), getattr(self.sparse, attr)
            saved = f"{100 * (before - after) / before:.1f}%" if before else "-"
            lines.append(f"  {label:<21}{f'{before:,}{unit}':>14}{f'{after:,}{unit}':>14}{saved:>9}")
        return "\n".join(lines)


# -- the analysis functions ------------------------------------------------------------------


def _gradient_function(module: ir.Module, name: str, full: bool) -> None:
    """Cut `name` down to its forward, returning the loss and its gradients (see the module
    docstring); every other public function is dropped."""
    for op in list(module.body.operations):
        if (
            op.operation.name == "func.func"
            and ir.StringAttr(op.attributes["sym_name"]).value != name
            and "sym_visibility" not in op.attributes
        ):
            op.operation.erase()
    target = function_named(module.operation, name)
    block = target.regions[0].blocks[0]
    grads = [op.operation for op in block.operations if op.operation.name == "pock.grad"]
    params = [op.operation for op in block.operations if op.operation.name == "pock.param"]
    loss = grads[0].operands[0]
    wanted = (
        [(p.results[0], p.results[0].type) for p in params]
        if full
        else [(g.operands[1], g.results[0].type) for g in grads]
    )
    keep = ancestors([loss]) | set(params)
    for op in reversed([op.operation for op in block.operations]):
        if op not in keep:
            op.erase()
    ip = ir.InsertionPoint(block)
    gradients = [GradOp(loss, p, t, ip=ip).grad for p, t in wanted]
    func.ReturnOp([loss, *gradients], ip=ip)
    target.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], [loss.type, *(g.type for g in gradients)])
    )


def _backward(text: str, function: str, full: bool, measure):
    """`measure` of the backward of `function` (see the module docstring)."""
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        _gradient_function(module, function, full)
        run_pipeline(module, f"{STAGE_PIPELINES['autodiff']},{STAGE_PIPELINES['sparse']}")
        target = function_named(module.operation, function)
        return measure(target)


def _cost(text: str, function: str, full: bool) -> BackwardCost:
    return _backward(text, function, full, backward_cost)


def full_backward_shares(text: str, function: str = TRAIN_STEP) -> tuple[list[str], GradientShares]:
    """Every parameter's name and its gradient's share of the full-BP backward of `function`
    (pock_mlir.cost.GradientShares: the cost of any subset of gradients, the sparse-scheme search's
    cost model), in one run of the autodiff and sparse stages."""
    names = [p.name for p in training_functions(text)[function]]
    return names, _backward(text, function, True, gradient_shares)


def training_functions(text: str) -> dict[str, list[ParameterPolicy]]:
    """The functions of a module that ask for gradients, with their parameters' policies (read
    from the pock.grad result types: none is frozen, fewer rows than the parameter channels)."""
    found = {}
    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        for fn in module.body.operations:
            if fn.operation.name != "func.func":
                continue
            ops = [op.operation for op in fn.regions[0].blocks[0].operations]
            grad_shapes = {g.operands[1]: tensor_type_of(g.results[0]).shape for g in ops if g.name == "pock.grad"}
            if not grad_shapes:
                continue
            policies = []
            for p in (op for op in ops if op.name == "pock.param"):
                shape, grad_shape = tensor_type_of(p.results[0]).shape, grad_shapes.get(p.results[0])
                if grad_shape is None:
                    policies.append(ParameterPolicy(param_name(p), shape, "frozen", 0))
                elif grad_shape != shape:
                    policies.append(ParameterPolicy(param_name(p), shape, "channels", grad_shape[0]))
                else:
                    policies.append(ParameterPolicy(param_name(p), shape, "full", shape[0] if shape else 1))
            found[ir.StringAttr(fn.attributes["sym_name"]).value] = policies
    return found


def report(text: str, function: str, scheme: str = "", unmatched=(), not_requiring_grad=()) -> Report:
    """The report for one training function of a training-stage module."""
    functions = training_functions(text)
    if function not in functions:
        raise ReportError(
            f"no function @{function} with pock.grad ops; the report reads a training-stage module "
            f"(program.ir('training'), before pock-autodiff); training functions: "
            f"{', '.join(functions) or 'none'}"
        )
    return Report(
        function,
        functions[function],
        _cost(text, function, full=True),
        _cost(text, function, full=False),
        scheme,
        tuple(unmatched),
        tuple(not_requiring_grad),
    )


def module_reports(text: str) -> list[Report]:
    """A report for every function of the module that has pock.grad ops."""
    names = list(training_functions(text))
    if not names:
        raise ReportError(
            "the module has no pock.grad ops; the report reads a training-stage module "
            "(program.ir('training'), before pock-autodiff)"
        )
    return [report(text, name) for name in names]
