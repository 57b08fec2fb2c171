// RUN: pock-opt -p 'pock-lower-optimizers,canonicalize,func.func(cse),pock-strip-params' --mlir-print-ir-after-all %s -o %t 2>&1 | filecheck %s
// RUN: filecheck --check-prefix=OUTPUT %s < %t

// The IR is printed to stderr after every pass of the pipeline, pock and upstream alike, in
// pipeline order; the result still goes to the output file.

// CHECK: IR Dump After pock-lower-optimizers
// CHECK: func.func @sgd_step
// CHECK: "pock.param"
// CHECK: torch.aten.sub.Tensor
// CHECK: IR Dump After CanonicalizerPass
// CHECK: IR Dump After CSEPass: cse ('func.func' operation: @sgd_step)
// CHECK: "pock.param"
// CHECK: IR Dump After pock-strip-params
// CHECK-NOT: pock.
// CHECK: return

// OUTPUT-LABEL: func.func @sgd_step
// OUTPUT-NOT: pock.
// OUTPUT: torch.aten.sub.Tensor
func.func @sgd_step(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  %n = "pock.sgd"(%p, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}
