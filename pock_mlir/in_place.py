"""Which of the values a compiled step writes it may write into the buffers it reads them from.

train_step_into (passes/pock_step_into.py) reads the old parameters, optimizer state and buffers
from its arguments and writes the new ones into caller-given buffers. Passing the same buffer for
both halves their memory, but IREE cannot know the two arguments alias: it imports them as
separate resources and orders their commands independently. So the Trainer does it only where
IREE's own schedule shows it is safe, read from the step's stream-phase IR (`iree-compile
--compile-to=stream`, walked with IREE's Python bindings): for each tensor, one command writes the
new value, and every command that reads the old value is that command or runs entirely before it;
every read of the new value runs after it. For the momentum and AdamW updates the writer is the
fused update dispatch, which reads the old element where it writes the new one. A parameter is
also read by its layer's input gradient, which nothing in the dataflow orders before the update;
pock-order-param-reads (passes/pock_order_param_reads.py) adds that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iree.compiler import ir

READ, WRITE = 1, 2  # the bits of stream.cmd.dispatch's resource_accesses
DISPATCH_RESOURCES = 2  # stream.cmd.dispatch's operand segments: workload, uniform operands, resources, ...


@dataclass
class Command:
    """One command of the step's schedule; commands with the same `stage` may run concurrently."""

    stage: int
    name: str  # the op and, for a dispatch, its entry point
    reads: set = field(default_factory=set)  # (argument index, imported to be written)
    writes: set = field(default_factory=set)


def _async_function(module: ir.Module, function: str) -> ir.Operation:
    for op in module.body.operations:
        op = op.operation
        if op.name == "util.func" and ir.StringAttr(op.attributes["sym_name"]).value == f"{function}$async":
            return op
    raise ValueError(f"no @{function}$async in the stream IR")


def _is_resource(value: ir.Value) -> bool:
    return str(value.type).startswith("!stream.resource")


def _command(op: ir.Operation, stage: int, captured: dict) -> Command:
    """What a command reads and writes of the imported arguments (`captured`: the execute
    region's block arguments that name them)."""
    if op.name == "stream.cmd.dispatch":
        entry_point = str(ir.ArrayAttr(op.attributes["entry_points"])[0])
        command = Command(stage, f"{op.name} {entry_point}")
        sizes = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        first = sum(sizes[:DISPATCH_RESOURCES])
        resources = list(op.operands)[first : first + sizes[DISPATCH_RESOURCES]]
        for resource, access in zip(resources, ir.ArrayAttr(op.attributes["resource_accesses"])):
            if resource in captured:
                access = ir.IntegerAttr(access).value
                if access & READ:
                    command.reads.add(captured[resource])
                if access & WRITE:
                    command.writes.add(captured[resource])
        return command
    command = Command(stage, op.name)
    resources = [captured[v] for v in op.operands if _is_resource(v) and v in captured]
    if op.name == "stream.cmd.copy" and resources:  # source, then target
        command.reads.add(resources[0])
        command.writes.update(resources[1:])
    elif op.name == "stream.cmd.fill":
        command.writes.update(resources)
    else:  # unknown effects: assume both
        command.reads.update(resources)
        command.writes.update(resources)
    return command


def step_commands(stream_ir: str, function: str) -> list[Command]:
    """The commands of `function`'s asynchronous body that touch its imported arguments, in order."""
    with ir.Context():
        module = ir.Module.parse(stream_ir)
        entry = _async_function(module, function).regions[0].blocks[0]
        imports = {}  # imported resource -> (argument index, imported to be written)
        commands: list[Command] = []
        stage = 0

        def walk(block: ir.Block, captured: dict, concurrent: bool) -> None:
            nonlocal stage
            for op in block.operations:
                op = op.operation
                if op.name == "stream.cmd.concurrent":
                    stage += 1
                    walk(op.regions[0].blocks[0], captured, True)
                    stage += 1
                elif op.name == "stream.cmd.serial":
                    walk(op.regions[0].blocks[0], captured, concurrent)
                elif op.name.startswith("stream.cmd."):
                    if not concurrent:
                        stage += 1
                    command = _command(op, stage, captured)
                    if command.reads or command.writes:
                        commands.append(command)

        for op in entry.operations:
            op = op.operation
            if op.name == "stream.tensor.import" and isinstance(op.operands[0].owner, ir.Block):
                imports[op.results[0]] = (ir.BlockArgument(op.operands[0]).arg_number, "consume" in op.attributes)
            elif op.name == "stream.cmd.execute":  # its region's block arguments name the imports afresh
                body = op.regions[0].blocks[0]
                captured = {
                    inner: imports[outer] for outer, inner in zip(op.operands, body.arguments) if outer in imports
                }
                stage += 1
                walk(body, captured, False)
        return commands


def _problems(commands: list[Command], pairs: list[tuple[int, int]]) -> list[str]:
    problems = []
    for read_arg, written_arg in pairs:
        old, new = (read_arg, False), (written_arg, True)
        writers = [c for c in commands if new in c.writes]
        if len(writers) != 1:
            problems.append(f"argument {written_arg} is written by {len(writers)} commands, not one")
            continue
        (writer,) = writers
        early = [c for c in commands if old in c.reads and c is not writer and c.stage >= writer.stage]
        late = [c for c in commands if new in c.reads and c is not writer and c.stage <= writer.stage]
        if early or late:
            problems.append(
                f"argument {read_arg} is read by {(early or late)[0].name} "
                f"while or after {writer.name} writes argument {written_arg}"
            )
    return problems


def unsafe_in_place(stream_ir: str, function: str, pairs: list[tuple[int, int]]) -> list[str]:
    """For (read argument, written argument) pairs of `function`, why passing one buffer as both
    is unsafe; empty when every pair is safe."""
    return _problems(step_commands(stream_ir, function), pairs)


def roles_in_place(stream_ir: str, function: str, pairs_by_role: dict[str, list[tuple[int, int]]]) -> frozenset[str]:
    """The roles (pock_mlir.abi's) all of whose pairs are safe to pass as one buffer."""
    commands = step_commands(stream_ir, function)
    return frozenset(role for role, pairs in pairs_by_role.items() if pairs and not _problems(commands, pairs))
