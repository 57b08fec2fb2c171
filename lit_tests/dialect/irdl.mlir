// RUN: pock-opt --emit-irdl -o %t.irdl
// RUN: filecheck --check-prefix=IRDL %s < %t.irdl
// RUN: iree-opt --irdl-file=%t.irdl --split-input-file --verify-diagnostics %s | filecheck %s

// Stock iree-opt, given the IRDL that pock-opt emits, parses, verifies and prints pock IR.

// IRDL: irdl.dialect @pock
// IRDL: irdl.operation @param
// IRDL: irdl.attributes {"param_name" = %{{.*}}, "policy" = %{{.*}}, "ratio" = %{{.*}}}
// IRDL: irdl.operation @grad
// IRDL: irdl.operands(loss: %{{.*}}, param: %{{.*}})
// IRDL: irdl.operation @sgd
// IRDL: irdl.operation @sgd_momentum
// IRDL: irdl.results(new_param: %{{.*}}, new_momentum_buffer: %{{.*}})
// IRDL: irdl.operation @adamw
// IRDL: irdl.results(new_param: %{{.*}}, new_exp_avg: %{{.*}}, new_exp_avg_sq: %{{.*}})
// IRDL: irdl.operation @channel_slice
// IRDL: irdl.operation @channel_update

// CHECK-LABEL: func.func @every_pock_op
// CHECK-SAME: (%[[W:.*]]: !torch.vtensor<[8,3],f32>, %[[LOSS:.*]]: !torch.vtensor<[],f32>, %[[STATE:.*]]: !torch.vtensor<[2,3],f32>, %[[STEP:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[P:.*]] = "pock.param"(%[[W]]) {param_name = "conv.weight", policy = "channels", ratio = 2.500000e-01 : f64}
// CHECK: %[[G:.*]] = "pock.grad"(%[[LOSS]], %[[P]]) : {{.*}} -> !torch.vtensor<[2,3],f32>
// CHECK: %[[S:.*]] = "pock.channel_slice"(%[[P]]) {channels = 2 : i64}
// CHECK: %[[SGD:.*]] = "pock.sgd"(%[[S]], %[[G]]) {lr = 1.000000e-01 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK: %[[MOM:.*]]:2 = "pock.sgd_momentum"(%[[SGD]], %[[G]], %[[STATE]], %[[STEP]]) {dampening = 0.000000e+00 : f64, lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64, nesterov = false, weight_decay = 0.000000e+00 : f64}
// CHECK: %[[ADAM:.*]]:3 = "pock.adamw"(%[[MOM]]#0, %[[G]], %[[STATE]], %[[STATE]], %[[STEP]]) {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK: %[[U:.*]] = "pock.channel_update"(%[[P]], %[[ADAM]]#0)
// CHECK: return %[[U]]
func.func @every_pock_op(%w: !torch.vtensor<[8,3],f32>, %loss: !torch.vtensor<[],f32>, %state: !torch.vtensor<[2,3],f32>, %step: !torch.vtensor<[],f32>) -> !torch.vtensor<[8,3],f32> {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "channels", ratio = 0.25 : f64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[8,3],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
  %s = "pock.channel_slice"(%p) {channels = 2 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
  %a = "pock.sgd"(%s, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  %b:2 = "pock.sgd_momentum"(%a, %g, %state, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>)
  %c:3 = "pock.adamw"(%b#0, %g, %state, %state, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>)
  %u = "pock.channel_update"(%p, %c#0) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32>
  return %u : !torch.vtensor<[8,3],f32>
}

// -----

// IRDL checks the structure: operands, results and attributes with their kinds.

func.func @missing_attribute(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op attribute "ratio" is expected but not provided}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full"} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @attribute_of_wrong_kind(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{expected base attribute 'builtin.float' but got 'builtin.integer'}}
  %n = "pock.sgd"(%w, %w) {lr = 1 : i64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @missing_result(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{op expects exactly 2 results, but got 1}}
  %n = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @unknown_op(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{unregistered operation 'pock.bogus'}}
  %p = "pock.bogus"(%w) : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

// The value rules (lr > 0, matching shapes, ...) are pock's Python verifiers, which stock
// tools do not run: iree-opt accepts a negative learning rate that pock-opt rejects
// (dialect/invalid.mlir).

// CHECK-LABEL: func.func @value_rules_are_not_in_irdl
// CHECK: "pock.sgd"{{.*}}lr = -1.000000e-01 : f64
func.func @value_rules_are_not_in_irdl(%w: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %n = "pock.sgd"(%w, %w) {lr = -0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}
