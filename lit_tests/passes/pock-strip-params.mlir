// RUN: pock-opt --split-input-file --verify-diagnostics -p pock-strip-params %s | filecheck %s

// CHECK-LABEL: func.func @params_become_their_values(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[2,3],f32>, %[[W:.*]]: !torch.vtensor<[3,4],f32>, %[[B:.*]]: !torch.vtensor<[4],f32>)
// CHECK-NOT: pock.param
// CHECK: %[[Y:.*]] = torch.aten.mm %[[X]], %[[W]]
// CHECK: %[[OUT:.*]] = torch.aten.add.Tensor %[[Y]], %[[B]], %{{.*}}
// CHECK: return %[[OUT]], %[[W]]
func.func @params_become_their_values(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,4],f32>, %b: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[2,4],f32>, !torch.vtensor<[3,4],f32>) {
  %pw = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32>
  %pb = "pock.param"(%b) {param_name = "fc.bias", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %y = torch.aten.mm %x, %pw : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[2,4],f32>
  %int1 = torch.constant.int 1
  %out = torch.aten.add.Tensor %y, %pb, %int1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
  return %out, %pw : !torch.vtensor<[2,4],f32>, !torch.vtensor<[3,4],f32>
}

// -----

// Any other pock op left means a pass was skipped; the error names the pass to run.

func.func @grad_left_over(%w: !torch.vtensor<[3],f32>, %loss: !torch.vtensor<[],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  // expected-error @+1 {{pock-strip-params: pock.grad is still present; run pock-autodiff before this pass}}
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %g : !torch.vtensor<[3],f32>
}

// -----

func.func @optimizer_left_over(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  // expected-error @+1 {{pock-strip-params: pock.sgd is still present; run pock-lower-optimizers before this pass}}
  %n = "pock.sgd"(%w, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}

// -----

func.func @channel_update_left_over(%w: !torch.vtensor<[8,3],f32>, %u: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32> {
  // expected-error @+1 {{pock-strip-params: pock.channel_update is still present; run pock-lower-optimizers before this pass}}
  %r = "pock.channel_update"(%w, %u) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32>
  return %r : !torch.vtensor<[8,3],f32>
}
