"""The sparse-BP report on a two-layer MLP whose backward is counted by hand."""

import pytest

from pock_mlir.abi import TRAIN_STEP
from pock_mlir.cost import BackwardCost
from pock_mlir.report import ReportError, report
from pock_mlir.tools.pock_opt import main as pock_opt

# x [5,3] -> fc0 (W0 [4,3], no bias) -> ReLU -> fc1 (W1 [4,4], b1 [4]) -> sum = loss.
FORWARD = """
func.func @step(%w0: !torch.vtensor<[4,3],f32>, %w1: !torch.vtensor<[4,4],f32>, %b1: !torch.vtensor<[4],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, {grad_types}) {{
  %p0 = "pock.param"(%w0) {{param_name = "fc0.weight", policy = "{w0}", ratio = 1.0 : f64}} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %p1 = "pock.param"(%w1) {{param_name = "fc1.weight", policy = "{w1}", ratio = {ratio} : f64}} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %q1 = "pock.param"(%b1) {{param_name = "fc1.bias", policy = "{b1}", ratio = {ratio} : f64}} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %h = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[5,4],f32>
  %r = torch.aten.relu %h : !torch.vtensor<[5,4],f32> -> !torch.vtensor<[5,4],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %m = torch.aten.mm %r, %t1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[5,4],f32>
  %int1 = torch.constant.int 1
  %o = torch.aten.add.Tensor %m, %q1, %int1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[5,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %o, %none : !torch.vtensor<[5,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  {grads}
  return %loss, {grad_names} : !torch.vtensor<[],f32>, {grad_types}
}}
"""


PARAMS = {"fc0.weight": ("%p0", "4,3"), "fc1.weight": ("%p1", "4,4"), "fc1.bias": ("%q1", "4")}


def step_ir(w0, w1, b1, ratio, grads: dict[str, str]) -> str:
    """The step with a pock.grad of each parameter in `grads` (name -> gradient shape)."""
    lines = [
        f'%g{i} = "pock.grad"(%loss, {PARAMS[n][0]}) : (!torch.vtensor<[],f32>, '
        f"!torch.vtensor<[{PARAMS[n][1]}],f32>) -> !torch.vtensor<[{shape}],f32>"
        for i, (n, shape) in enumerate(grads.items())
    ]
    return FORWARD.format(
        w0=w0,
        w1=w1,
        b1=b1,
        ratio=ratio,
        grads="\n  ".join(lines),
        grad_names=", ".join(f"%g{i}" for i in range(len(grads))),
        grad_types=", ".join(f"!torch.vtensor<[{shape}],f32>" for shape in grads.values()),
    )


CHANNEL_SPARSE = step_ir("frozen", "channels", "channels", 0.5, {"fc1.weight": "2,4", "fc1.bias": "2"})
BIAS_ONLY = step_ir("frozen", "frozen", "full", 1.0, {"fc1.bias": "4"})

# Full BP, op by op in the order pock-autodiff emits them (FLOPs: mm 2*m*k*n, elementwise and
# reductions the largest element count, layout ops and fills 0):
#   full [] (the loss seed)                       0
#   view [1,1], expand [5,4] (sum's cotangent)    0, 0
#   sum.dim_IntList [5,4]->[1,4], view [4]        20, 0      fc1.bias
#   transpose W1^T, mm [5,4]x[4,4] -> [5,4]       0, 160     input gradient of fc1
#   transpose g, mm [4,5]x[5,4] -> [4,4]          0, 160     fc1.weight (in W's layout: g^T r)
#   threshold_backward [5,4]                      20         ReLU
#   transpose g, mm [4,5]x[5,3] -> [4,3]          0, 120     fc0.weight (x's gradient is never built)
# = 12 ops, 480 FLOPs. The only batch-dependent forward value read is r, 5x4 floats = 80 B;
# gradients 12 + 16 + 4 floats = 128 B.
FULL_BP = BackwardCost(ops=12, flops=480, saved_activation_bytes=80, gradient_bytes=128)


def test_channel_sparse_layer_on_a_frozen_one_by_hand():
    # fc0 frozen: no ReLU backward, no input gradient of fc1, no fc0.weight gradient. Half of
    # fc1's channels: the seed's expand is sliced to [5,2] (every use wants 2 columns), then
    #   full, view [1,1], expand [5,2]                0, 0, 0
    #   sum.dim_IntList [5,2]->[1,2], view [2]        10, 0
    #   transpose g, mm [2,5]x[5,4] -> [2,4]          0, 80
    # = 7 ops, 90 FLOPs; r is still read (80 B); gradients 8 + 2 floats = 40 B.
    result = report(CHANNEL_SPARSE, "step")
    assert result.full == FULL_BP
    assert result.sparse == BackwardCost(ops=7, flops=90, saved_activation_bytes=80, gradient_bytes=40)
    assert [(p.name, p.policy, p.rows) for p in result.parameters] == [
        ("fc0.weight", "frozen", 0),
        ("fc1.weight", "channels", 2),
        ("fc1.bias", "channels", 2),
    ]


def test_bias_only_saves_no_activations():
    # full, view [1,1], expand [5,4], sum.dim_IntList (20 FLOPs), view [4]: no forward value.
    result = report(BIAS_ONLY, "step")
    assert result.full == FULL_BP
    assert result.sparse == BackwardCost(ops=5, flops=20, saved_activation_bytes=0, gradient_bytes=16)


# x [1,1,5,5] -> conv0 (W0 [2,1,3,3], trained) -> times 2 -> s -> conv1 (W1 [1,2,3,3], frozen) -> sum = loss.
CONVS = """
func.func @step(%w0: !torch.vtensor<[2,1,3,3],f32>, %w1: !torch.vtensor<[1,2,3,3],f32>, %x: !torch.vtensor<[1,1,5,5],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[2,1,3,3],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "conv0.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,1,3,3],f32>) -> !torch.vtensor<[2,1,3,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "conv1.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[1,2,3,3],f32>) -> !torch.vtensor<[1,2,3,3],f32>
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %ones = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %zeros = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %c0 = torch.aten.convolution %x, %p0, %none, %ones, %zeros, %ones, %false, %zeros, %int1 : !torch.vtensor<[1,1,5,5],f32>, !torch.vtensor<[2,1,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,2,3,3],f32>
  %float2 = torch.constant.float 2.000000e+00
  %s = torch.aten.mul.Scalar %c0, %float2 : !torch.vtensor<[1,2,3,3],f32>, !torch.float -> !torch.vtensor<[1,2,3,3],f32>
  %c1 = torch.aten.convolution %s, %p1, %none, %ones, %zeros, %ones, %false, %zeros, %int1 : !torch.vtensor<[1,2,3,3],f32>, !torch.vtensor<[1,2,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[1,1,1,1],f32>
  %loss = torch.aten.sum %c1, %none : !torch.vtensor<[1,1,1,1],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g0 = "pock.grad"(%loss, %p0) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,1,3,3],f32>) -> !torch.vtensor<[2,1,3,3],f32>
  return %loss, %g0 : !torch.vtensor<[],f32>, !torch.vtensor<[2,1,3,3],f32>
}
"""


def test_a_value_read_for_its_shape_alone_is_not_saved():
    # conv1's input gradient, convolution_backward(g, s, W1) asking for the input's gradient only,
    # reads s for its shape alone; W0's gradient reads x, an argument: nothing is saved. Full BP
    # trains W1 too, whose gradient reads s: 1 x 2 x 3 x 3 floats = 72 B.
    result = report(CONVS, "step")
    assert (result.full.saved_activation_bytes, result.sparse.saved_activation_bytes) == (72, 0)


def test_report_table():
    assert (
        str(report(CHANNEL_SPARSE, "step", scheme="custom"))
        == """\
sparse backpropagation report: @step (scheme: custom)
  parameter   shape           policy
  fc0.weight  4x3             frozen
  fc1.weight  4x4             channels 2/4
  fc1.bias    4               channels 2/4
  2 of 3 parameters trained

  backward                    full BP     sparse BP    saved
  ops                              12             7    41.7%
  FLOPs                           480            90    81.2%
  saved activations              80 B          80 B     0.0%
  parameter gradients           128 B          40 B    68.8%"""
    )


def test_pock_opt_prints_the_report(tmp_path, capsys):
    path = tmp_path / "step.mlir"
    path.write_text(BIAS_ONLY)
    assert pock_opt([str(path), "--pock-report"]) == 0
    out = capsys.readouterr().out
    assert "fc1.bias    4               full" in out
    assert "saved activations              80 B           0 B   100.0%" in out


def test_report_needs_a_training_stage_module(tmp_path, capsys):
    path = tmp_path / "step.mlir"
    path.write_text(BIAS_ONLY)
    assert pock_opt([str(path), "-p", "pock-autodiff", "--pock-report"]) == 1
    assert "the module has no pock.grad ops; the report reads a training-stage module" in capsys.readouterr().err
    with pytest.raises(ReportError, match=r"no function @train_step with pock.grad ops.*training functions: step"):
        report(BIAS_ONLY, TRAIN_STEP)
