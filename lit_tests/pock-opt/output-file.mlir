// RUN: pock-opt -p pock-strip-params %s -o %t | filecheck --allow-empty --check-prefix=STDOUT %s
// RUN: filecheck %s < %t

// -o writes the result to the file and nothing to stdout.

// STDOUT-NOT: {{.}}

// CHECK-LABEL: func.func @written_to_file(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>)
// CHECK-NEXT: return %[[W]]
func.func @written_to_file(%w: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %p : !torch.vtensor<[3],f32>
}
