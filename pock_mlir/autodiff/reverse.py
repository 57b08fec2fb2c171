"""Reverse-mode differentiation of a straight-line torch-dialect block.

Only ops that both depend on a requested parameter and lead to the loss are differentiated,
so an op without a rule in a frozen part of the model never needs one.
"""

import os
import re

from torch_mlir import ir

from pock_mlir.op_facts import facts_of, op_key, param_name
from pock_mlir.torch_builder import TorchBuilder, decode_operand
from pock_mlir.torch_types import tensor_type_of


class MissingRuleError(Exception):
    def __init__(self, message: str, location: ir.Location):
        super().__init__(message)
        self.location = location


def parameter_name(value: ir.Value, index: int) -> str:
    owner = value.owner
    if not isinstance(owner, ir.Block) and owner.name == "pock.param":
        return param_name(owner)
    return f"parameter #{index}"


_FRAME = re.compile(r'"([^"]+)":(\d+)')
_LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}pock_mlir{os.sep}", "site-packages")


def describe_location(loc: ir.Location) -> str:
    """The model's own source line for an op: the innermost frame outside torch and pock_mlir
    (callsite locations list the innermost frame first), with the library frame it came through."""
    # "-" is the name MLIR gives text parsed from a string without one (pock-opt names its input)
    frames = [f"line {line}" if path == "-" else f"{path}:{line}" for path, line in _FRAME.findall(str(loc))]
    if not frames:
        return str(loc)
    user = [f for f in frames if not any(part in f for part in _LIBRARY_PARTS)]
    if user and user[0] != frames[0]:
        return f"{user[0]} (through {frames[0]})"
    return user[0] if user else frames[0]


def _is_differentiable(value: ir.Value) -> bool:
    t = tensor_type_of(value)
    return t is not None and t.is_float


def differentiate(loss: ir.Value, params: list[ir.Value], insert_before: ir.Operation) -> list[ir.Value | None]:
    """Emit the backward pass of `loss` before `insert_before`; returns d(loss)/d(param)
    for each parameter (None where the loss does not depend on it)."""
    block = insert_before.block
    forward = []
    for op in block.operations:
        if op.operation == insert_before.operation:
            break
        forward.append(op.operation)

    # Which parameters each value depends on (as a set of indices).
    depends: dict[ir.Value, frozenset[int]] = {}
    for i, p in enumerate(params):
        depends[p] = depends.get(p, frozenset()) | {i}
    for op in forward:
        deps = frozenset().union(*(depends.get(o, frozenset()) for o in op.operands))
        if deps:
            for r in op.results:
                depends[r] = deps

    # Which values the loss depends on.
    reaches = {loss}
    for op in reversed(forward):
        if any(r in reaches for r in op.results):
            reaches.update(op.operands)

    builder = TorchBuilder(ir.InsertionPoint(insert_before), insert_before.location)
    cotangents: dict[ir.Value, ir.Value] = {loss: builder.ones_like(loss)}

    def accumulate(value, ct):
        if ct is None or value not in depends or not _is_differentiable(value):
            return
        cotangents[value] = builder.add(cotangents[value], ct) if value in cotangents else ct

    leaves = set(params)
    for op in reversed(forward):
        if op.name == "torch.prim.ListConstruct":
            continue  # its elements receive cotangents from the op that consumes the list
        if any(r in leaves for r in op.results):
            continue  # a parameter's own definition (pock.param): differentiation stops here
        results = list(op.results)
        grads = [cotangents.get(r) for r in results]
        if all(g is None for g in grads):
            continue
        rule = facts_of(op).rule
        if rule is None and op.name == "func.call":
            raise MissingRuleError(
                f"cannot differentiate through the call to {op.attributes['callee']} (at "
                f"{describe_location(op.location)}): run the 'inline' pass before pock-autodiff "
                f"(e.g. pock-opt -p 'inline,pock-autodiff,...'), as compile_training does",
                op.location,
            )
        if rule is None:
            needed = sorted(set().union(*(depends.get(r, frozenset()) for r in results)))
            names = ", ".join(parameter_name(params[i], i) for i in needed)
            raise MissingRuleError(
                f"no derivative rule for {op.name} (at {describe_location(op.location)}); "
                f"the gradients of {names} need it. Freeze these parameters (for example "
                f"sparse={{'<pattern>': 'frozen'}}) or add a rule for '{op_key(op)}' in pock_mlir/autodiff/rules/",
                op.location,
            )
        b = builder.at(op.location)
        if len(results) == 1:
            g, out = grads[0], results[0]
        else:
            g = tuple(
                gr if gr is not None or not _is_differentiable(r) else b.zeros_like(r) for gr, r in zip(grads, results)
            )
            out = tuple(results)
        args = [decode_operand(o) for o in op.operands]
        try:
            operand_cts = rule(b, g, out, *args)
        except NotImplementedError as e:  # a rule that covers only some of its op's attributes
            raise MissingRuleError(
                f"{op.name} (at {describe_location(op.location)}): {e}; freeze the parameters "
                f"before it (sparse={{'<pattern>': 'frozen'}}) or extend the rule for "
                f"'{op_key(op)}' in pock_mlir/autodiff/rules/",
                op.location,
            ) from None
        except ValueError as e:  # operands the op itself cannot take (hand-written IR): say which op
            raise MissingRuleError(
                f"{op.name} (at {describe_location(op.location)}): its operands and result do "
                f"not fit each other, so it cannot be differentiated: {e}",
                op.location,
            ) from None
        if len(operand_cts) != len(args):
            raise AssertionError(
                f"rule for {op_key(op)} returned {len(operand_cts)} cotangents for {len(args)} operands"
            )
        for operand, ct in zip(op.operands, operand_cts):
            if isinstance(ct, (list, tuple)):  # a tensor-list operand: cotangents per element
                for element, element_ct in zip(operand.owner.operands, ct):
                    accumulate(element, element_ct)
            else:
                accumulate(operand, ct)

    return [cotangents.get(p) for p in params]
