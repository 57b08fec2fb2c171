// RUN: pock-opt %s | pock-opt | filecheck %s

// Every pock op survives print and re-parse with its operands, attributes and types.

// CHECK-LABEL: func.func @param_and_grad
// CHECK-SAME: (%[[W:.*]]: !torch.vtensor<[4,3],f32>, %[[LOSS:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[P:.*]] = "pock.param"(%[[W]]) {param_name = "fc.weight", policy = "full", ratio = 1.000000e+00 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
// CHECK: %[[G:.*]] = "pock.grad"(%[[LOSS]], %[[P]]) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
// CHECK: return %[[G]]
func.func @param_and_grad(%w: !torch.vtensor<[4,3],f32>, %loss: !torch.vtensor<[],f32>) -> !torch.vtensor<[4,3],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  return %g : !torch.vtensor<[4,3],f32>
}

// CHECK-LABEL: func.func @channel_sparse_grad
// CHECK-SAME: (%[[W:.*]]: !torch.vtensor<[8,3],f32>, %[[LOSS:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[P:.*]] = "pock.param"(%[[W]]) {param_name = "conv.weight", policy = "channels", ratio = 2.500000e-01 : f64}
// CHECK: %[[G:.*]] = "pock.grad"(%[[LOSS]], %[[P]]) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
// CHECK: %[[S:.*]] = "pock.channel_slice"(%[[P]]) {channels = 2 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
// CHECK: %[[N:.*]] = "pock.sgd"(%[[S]], %[[G]]) {lr = 1.000000e-01 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK: %[[U:.*]] = "pock.channel_update"(%[[P]], %[[N]]) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32>
// CHECK: return %[[U]]
func.func @channel_sparse_grad(%w: !torch.vtensor<[8,3],f32>, %loss: !torch.vtensor<[],f32>) -> !torch.vtensor<[8,3],f32> {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "channels", ratio = 0.25 : f64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[8,3],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
  %s = "pock.channel_slice"(%p) {channels = 2 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
  %n = "pock.sgd"(%s, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  %u = "pock.channel_update"(%p, %n) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32>
  return %u : !torch.vtensor<[8,3],f32>
}

// CHECK-LABEL: func.func @optimizers
// CHECK-SAME: (%[[W:.*]]: !torch.vtensor<[4],f32>, %[[G:.*]]: !torch.vtensor<[4],f32>, %[[M:.*]]: !torch.vtensor<[4],f32>, %[[V:.*]]: !torch.vtensor<[4],f32>, %[[STEP:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[MOM:.*]]:2 = "pock.sgd_momentum"(%[[W]], %[[G]], %[[M]], %[[STEP]]) {dampening = 0.000000e+00 : f64, lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64, nesterov = true, weight_decay = 0.000000e+00 : f64}
// CHECK: %[[ADAM:.*]]:3 = "pock.adamw"(%[[W]], %[[G]], %[[M]], %[[V]], %[[STEP]]) {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-02 : f64}
// CHECK: return %[[MOM]]#0, %[[ADAM]]#0
func.func @optimizers(%w: !torch.vtensor<[4],f32>, %g: !torch.vtensor<[4],f32>, %m: !torch.vtensor<[4],f32>, %v: !torch.vtensor<[4],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %a:2 = "pock.sgd_momentum"(%w, %g, %m, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = true} : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>)
  %b:3 = "pock.adamw"(%w, %g, %m, %v, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>)
  return %a#0, %b#0 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}
