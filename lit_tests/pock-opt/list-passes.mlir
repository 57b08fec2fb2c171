// RUN: pock-opt --list-passes | filecheck %s

// Every pock pass is listed by its command-line name with its description.

// CHECK: pock passes (combine them with any upstream MLIR pass
// CHECK: pock-autodiff: Expand pock.grad into reverse-mode backward ops
// CHECK: pock-dce: Erase torch and pock ops whose results are unused
// CHECK: pock-lower-optimizers: Lower pock optimizer updates (sgd, sgd_momentum, adamw, ort_adamw) and channel slices
// CHECK: pock-strip-params: Replace pock.param markers by their values
