// RUN: not pock-opt %s -p pock-autodiff 2>&1 | filecheck %s
// RUN: not pock-opt - -p pock-autodiff < %s 2>&1 | filecheck --check-prefix=STDIN %s
// RUN: not pock-opt --split-input-file %s -p pock-autodiff 2>&1 | filecheck %s
// RUN: not pock-opt --pock-report %s 2>&1 | filecheck --check-prefix=REPORT %s

// Locations inside a pass's message name the input file, as the diagnostic's own prefix does, also
// for stdin and split chunks. --pock-report differentiates the module again: its errors are
// diagnostics at the input's lines too, not an internal error.

// CHECK: locations-name-the-file.mlir:[[# @LINE + 8]]:8: error: pock-autodiff: no derivative rule for torch.aten.erfinv (at {{.*}}locations-name-the-file.mlir:[[# @LINE + 8]])
// STDIN: <stdin>:[[# @LINE + 7]]:8: error: pock-autodiff: no derivative rule for torch.aten.erfinv (at <stdin>:[[# @LINE + 7]])
// REPORT-NOT: internal error
// REPORT: locations-name-the-file.mlir:[[# @LINE + 5]]:8: error: pock-autodiff: no derivative rule for torch.aten.erfinv (at {{.*}}locations-name-the-file.mlir:[[# @LINE + 5]])
// REPORT-NOT: internal error

func.func @op_without_rule(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %y = torch.aten.erfinv %p : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}
