// RUN: pock-opt -p pock-strip-params < %s | filecheck %s

// Without an input file pock-opt reads stdin.

// CHECK-LABEL: func.func @read_from_stdin(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>)
// CHECK-NEXT: return %[[W]]
func.func @read_from_stdin(%w: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %p : !torch.vtensor<[3],f32>
}
