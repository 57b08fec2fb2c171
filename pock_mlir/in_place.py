"""Whether a compiled step may write its optimizer state into the buffers it reads it from.

train_step_into (passes/pock_step_into.py) reads the old state from its arguments and writes the
new state into caller-given buffers. Passing the same buffer for both halves the state's memory,
but IREE cannot know the two arguments alias: it imports them as separate resources and orders
their commands independently. So the Trainer does it only where IREE's own schedule shows it is
safe, read from the step's stream-phase IR (`iree-compile --compile-to=stream`): for each state
tensor, one command writes the new value, and every command that reads the old value is that
command or runs entirely before it; every read of the new value runs after it. For the momentum
and AdamW updates the writer is the fused update dispatch, which reads the old element where it
writes the new one. Parameters fail the check (the input gradient of a layer reads its weight
after the fused weight-gradient-and-update dispatch wrote the new one), so they stay in two sets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IMPORT = re.compile(r"(%[\w-]+) = stream\.tensor\.import on\([^)]*\) (consume )?%arg(\d+) ")
_CAPTURE = re.compile(r"(%[\w-]+) as (%[\w-]+):")
_BINDING = re.compile(r"\s*(ro|wo|rw) (%[\w-]+)\[")
_RESOURCE = re.compile(r"(%[\w-]+)\[")
_LOCATION = re.compile(r" loc\(.*\)$")  # the compiler API prints debug locations


@dataclass
class Command:
    """One command of the step's schedule; commands with the same `stage` may run concurrently."""

    stage: int
    text: str
    reads: set = field(default_factory=set)  # (argument index, imported to be written)
    writes: set = field(default_factory=set)

    @property
    def name(self) -> str:
        """The op and, for a dispatch, its entry point (without its workload operands)."""
        op, _, rest = self.text.partition(" ")
        return f"{op} {rest.split('(')[0].split()[0]}" if op == "stream.cmd.dispatch" else op


def step_commands(stream_ir: str, function: str) -> list[Command]:
    """The commands of `function`'s asynchronous body that touch its imported arguments, in order."""
    start = stream_ir.find(f"util.func public @{function}$async(")
    if start < 0:
        raise ValueError(f"no @{function}$async in the stream IR")
    body = [_LOCATION.sub("", line) for line in stream_ir[start:].splitlines()]
    body = body[:body.index("  }")]
    imports = {m.group(1): (int(m.group(3)), bool(m.group(2))) for m in map(_IMPORT.search, body) if m}
    commands: list[Command] = []
    captured: dict[str, tuple[int, bool]] = {}
    stage, concurrent = 0, False
    lines = iter(body)
    for line in lines:
        line = line.strip()
        if "stream.cmd.execute" in line:  # a new region: its block arguments name the imports afresh
            captured = {inner: imports[outer] for outer, inner in _CAPTURE.findall(line) if outer in imports}
            stage += 1
        elif line.startswith("stream.cmd.concurrent"):
            stage, concurrent = stage + 1, True
        elif line == "}" and concurrent:
            stage, concurrent = stage + 1, False
        elif line.startswith("stream.cmd.") and not line.startswith(("stream.cmd.serial", "stream.cmd.execute")):
            if not concurrent:
                stage += 1
            command = Command(stage, line)
            if line.startswith("stream.cmd.dispatch"):
                for binding in lines:
                    if binding.strip().startswith("}"):
                        break
                    m = _BINDING.match(binding)
                    if m and m.group(2) in captured:
                        if m.group(1) != "wo":
                            command.reads.add(captured[m.group(2)])
                        if m.group(1) != "ro":
                            command.writes.add(captured[m.group(2)])
            else:
                resources = [captured[r] for r in _RESOURCE.findall(line) if r in captured]
                if line.startswith("stream.cmd.copy") and resources:  # source, then target
                    command.reads.add(resources[0])
                    command.writes.update(resources[1:])
                elif line.startswith("stream.cmd.fill"):
                    command.writes.update(resources)
                else:  # unknown effects: assume both
                    command.reads.update(resources)
                    command.writes.update(resources)
            if command.reads or command.writes:
                commands.append(command)
    return commands


def unsafe_in_place(stream_ir: str, function: str, pairs: list[tuple[int, int]]) -> list[str]:
    """For (read argument, written argument) pairs of `function`, why passing one buffer as both
    is unsafe; empty when every pair is safe."""
    commands = step_commands(stream_ir, function)
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
            problems.append(f"argument {read_arg} is read by {(early or late)[0].name} "
                            f"while or after {writer.name} writes argument {written_arg}")
    return problems
