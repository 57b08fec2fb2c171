"""The check that decides what a step updates in place (pock_mlir/in_place.py): on schedules
written out here, and on IREE's schedule of a real step, where the parameters pass it with
pock-order-param-reads and fail it without (a layer's input gradient reads its weight while or
after the update writes the new one)."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.abi import TRAIN_STEP_INTO
from pock_mlir.in_place import unsafe_in_place
from pock_mlir.stages import STAGE_PIPELINES

RESOURCE = "!stream.resource<external>{%c16}"


def schedule(*commands: str) -> str:
    """@step$async importing argument 0 to read and argument 1 to write, then `commands` (dispatch
    lines name resources %old and %new) in one execute region."""
    body = "\n".join(f"      {line}" for command in commands for line in command.splitlines())
    return f"""module {{
  util.func public @step$async(%arg0: !hal.buffer_view, %arg1: !hal.buffer_view) {{
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %0 = stream.tensor.import on(#hal.device.affinity<@dev>) %arg0 : !hal.buffer_view -> tensor<4xf32> in {RESOURCE}
    %1 = stream.tensor.import on(#hal.device.affinity<@dev>) consume %arg1 : !hal.buffer_view -> tensor<4xf32> in {RESOURCE}
    %2 = stream.cmd.execute on(#hal.device.affinity<@dev>) with(%0 as %old: {RESOURCE}, %1 as %new: {RESOURCE}) {{
{body}
    }} => !stream.timepoint loc("step.mlir":3:5)
    util.return
  }}
}}
"""


def dispatch(name: str, *bindings: str) -> str:
    lines = ",\n".join(f"  {b}[%c0 for %c16] : {RESOURCE}" for b in bindings)
    return f"stream.cmd.dispatch @ex::@{name} {{\n{lines}\n}}"


def concurrent(*dispatches: str) -> str:
    inner = "\n".join("  " + line for d in dispatches for line in d.splitlines())
    return f'stream.cmd.concurrent {{\n{inner}\n}} loc("step.mlir":9:7)'


UPDATE = dispatch("update", "ro %old", "wo %new")

SCHEDULES = {
    "the update alone": ([UPDATE], []),
    "a reader of the old value before the update": ([dispatch("forward", "ro %old"), UPDATE], []),
    "a reader of the new value after the update": ([UPDATE, dispatch("apply", "ro %new")], []),
    "a reader of the old value beside the update": (
        [concurrent(UPDATE, dispatch("input_grad", "ro %old"))],
        ["read by stream.cmd.dispatch @ex::@input_grad"],
    ),
    "a reader of the old value after the update": (
        [UPDATE, dispatch("input_grad", "ro %old")],
        ["read by stream.cmd.dispatch @ex::@input_grad"],
    ),
    "two writers": ([UPDATE, dispatch("again", "rw %new")], ["written by 2 commands"]),
    "a copy into the new buffer after the read": (
        [dispatch("forward", "ro %old"), f"stream.cmd.copy %old[%c0], %new[%c0], %c16 : {RESOURCE} -> {RESOURCE}"],
        [],
    ),
}


@pytest.mark.parametrize("case", SCHEDULES)
def test_schedules(case):
    commands, expected = SCHEDULES[case]
    problems = unsafe_in_place(schedule(*commands), "step", [(0, 1)])
    assert len(problems) == len(expected)
    for problem, fragment in zip(problems, expected):
        assert fragment in problem


def momentum_step(pipelines=None):
    """An MLP step with momentum SGD and its stream-phase IR."""
    from iree.compiler import compile_str

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(16, 8).numpy(), torch.randint(0, 4, (16,)).numpy().astype(np.int32)
    program = pock.compile_training(model, x, y, optimizer=pock.SGD(lr=0.1, momentum=0.9), pipelines=pipelines)
    stream = compile_str(program.ir("lowered"), extra_args=[*program.iree_flags(), "--compile-to=stream"]).decode()
    return program, stream


def test_parameters_and_momentum_are_updated_in_place():
    program, stream = momentum_step()
    assert program.in_place == {"params", "optimizer"}  # the MLP has no buffers
    pairs = program.signature.written_argument_pairs()
    assert unsafe_in_place(stream, TRAIN_STEP_INTO, pairs["params"] + pairs["optimizer"]) == []


def test_parameters_are_not_without_ordering_their_reads():
    lowered = STAGE_PIPELINES["lowered"].replace("pock-order-param-reads,", "")
    program, stream = momentum_step({"lowered": lowered})
    assert program.in_place == {"optimizer"}
    problems = unsafe_in_place(stream, TRAIN_STEP_INTO, program.signature.written_argument_pairs()["params"])
    # the second layer's weight (argument 2) is read for its input's gradient while or after the
    # fused weight-gradient-and-update dispatch writes the new weight
    assert any(problem.startswith("argument 2 is read by") for problem in problems), problems


class BiLSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(40, 32, batch_first=True, bidirectional=True)
        self.head = nn.Linear(64, 12)

    def forward(self, frames):
        _, (final, _) = self.rnn(frames)
        return self.head(torch.cat([final[-2], final[-1]], -1))


def test_a_model_compiles_to_one_program_every_time():
    """pock-order-param-reads makes each update wait for values in the order it finds the
    parameter's views (an LSTM's backward reads its weights through several): compiled again, the
    same model is the same IR (before, the order was the values' hashes', new each compilation)."""
    torch.manual_seed(0)
    model, g = BiLSTMClassifier(), torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 4, 40, generator=g), torch.randint(0, 12, (4,), generator=g)
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    lowered = {
        pock.compile_training(model, x, y, optimizer=optimizer, functions=(), cache=False).ir("lowered")
        for _ in range(4)
    }
    assert len(lowered) == 1
