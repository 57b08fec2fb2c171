"""One table of op facts (pock_mlir.op_facts.FACTS), filled where each derivative rule is
defined: pock-sparse-bp, the cost model and pock-dce read it, so changing an op's entry changes
what each of them does with that op."""

import pytest
from pock_mlir.passes import run_pipeline
from torch_mlir import ir

import pock_mlir.autodiff  # noqa: F401  (its rule files fill FACTS)
from pock_mlir.context import make_context
from pock_mlir.cost import op_flops
from pock_mlir.op_facts import FACTS, derivative_rules, elementwise

CHANNEL_SPARSE_RELU = """
func.func @f(%w: !torch.vtensor<[8,4],f32>, %x: !torch.vtensor<[5,4],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>) {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %t = torch.aten.t %p : !torch.vtensor<[8,4],f32> -> !torch.vtensor<[4,8],f32>
  %m = torch.aten.mm %x, %t : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,8],f32> -> !torch.vtensor<[5,8],f32>
  %r = torch.aten.relu %m : !torch.vtensor<[5,8],f32> -> !torch.vtensor<[5,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %r, %none : !torch.vtensor<[5,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,4],f32>) -> !torch.vtensor<[4,4],f32>
  return %loss, %g : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>
}
"""


def run(text: str, pipeline: str) -> str:
    with make_context():
        module = ir.Module.parse(text)
        run_pipeline(module, pipeline)
        return str(module)


def threshold_backward_type(text: str) -> str:
    (line,) = [line for line in text.splitlines() if "threshold_backward" in line]
    return line.rsplit("-> ", 1)[1]


def test_sparse_bp_slices_through_an_op_because_of_its_entry(monkeypatch):
    assert FACTS["aten.threshold_backward"].slices is elementwise
    assert (
        threshold_backward_type(run(CHANNEL_SPARSE_RELU, "pock-autodiff,pock-sparse-bp")) == "!torch.vtensor<[5,4],f32>"
    )
    monkeypatch.setattr(FACTS["aten.threshold_backward"], "slices", None)
    assert (
        threshold_backward_type(run(CHANNEL_SPARSE_RELU, "pock-autodiff,pock-sparse-bp")) == "!torch.vtensor<[5,8],f32>"
    )


def test_cost_model_reads_the_view_fact(monkeypatch):
    with make_context():
        module = ir.Module.parse(CHANNEL_SPARSE_RELU)
        ops = {op.operation.name: op.operation for op in module.body.operations[0].regions[0].blocks[0].operations}
        assert op_flops(ops["torch.aten.mm"]) == 2 * 5 * 4 * 8 and op_flops(ops["torch.aten.t"]) == 0
        monkeypatch.setattr(FACTS["aten.t"], "free", False)
        assert op_flops(ops["torch.aten.t"]) == 32  # an op without a FLOPs fact: its largest element count


def test_dce_keeps_an_op_declared_effectful(monkeypatch):
    text = """
func.func @f(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %unused = torch.aten.neg %x : !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  return %x : !torch.vtensor<[3],f32>
}"""
    assert "aten.neg" not in run(text, "pock-dce")
    monkeypatch.setattr(FACTS["aten.neg"], "effectful", True)
    assert "aten.neg" in run(text, "pock-dce")


def test_every_fact_is_stated_once():
    from pock_mlir.op_facts import declare

    with pytest.raises(ValueError, match="aten.mm: rule is already declared"):
        declare("aten.mm", rule=lambda *a: a)
    assert "aten.threshold_backward" not in derivative_rules()  # a backward-only op: facts, no rule
