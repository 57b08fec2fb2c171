// RUN: echo '{"cfg.fc1": 0.5}' > %t.json
// RUN: pock-opt %s -p 'pock-apply-sparse-config{config=%t.json}' | filecheck %s
// RUN: not pock-opt %s -p 'pock-apply-sparse-config' 2>&1 | filecheck %s --check-prefix=NOCONFIG

// NOCONFIG: pock-apply-sparse-config needs config=FILE (a YAML/JSON sparse scheme)

// A training-stage step ({"cfg.fc1": 0.5}, every other parameter frozen): the
// signature stays, cfg.fc0 loses its gradient and update (its parameter and momentum buffer
// come back unchanged), cfg.fc1's gradient and update cover its first 4 rows.
// CHECK-LABEL: func.func @config_reannotates
// CHECK-SAME: -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>)
// CHECK: %[[P0:.*]] = "pock.param"(%arg0) {param_name = "cfg.fc0.weight", policy = "frozen", ratio = 1.000000e+00 : f64}
// CHECK: %[[P1:.*]] = "pock.param"(%arg1) {param_name = "cfg.fc1.weight", policy = "channels", ratio = 5.000000e-01 : f64}
// CHECK-NOT: "pock.grad"(%{{.*}}, %[[P0]])
// CHECK: %[[G1:.*]] = "pock.grad"(%{{.*}}, %[[P1]]) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,4],f32>) -> !torch.vtensor<[4,4],f32>
// CHECK-DAG: %[[W:.*]] = "pock.channel_slice"(%[[P1]]) {channels = 4 : i64}
// CHECK-DAG: %[[B:.*]] = "pock.channel_slice"(%arg3) {channels = 4 : i64}
// CHECK: %[[NEW:.*]]:2 = "pock.sgd_momentum"(%[[W]], %[[G1]], %[[B]], %arg4) {{.*}} -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>)
// CHECK: %[[W1:.*]] = "pock.channel_update"(%[[P1]], %[[NEW]]#0)
// CHECK: %[[B1:.*]] = "pock.channel_update"(%arg3, %[[NEW]]#1)
// CHECK-NOT: pock.sgd_momentum
// CHECK: return %{{.*}}, %[[P0]], %[[W1]], %arg2, %[[B1]]
func.func @config_reannotates(%w0: !torch.vtensor<[4,3],f32>, %w1: !torch.vtensor<[8,4],f32>, %m0: !torch.vtensor<[4,3],f32>, %m1: !torch.vtensor<[8,4],f32>, %step: !torch.vtensor<[],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "cfg.fc0.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "cfg.fc1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %h = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[5,4],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[8,4],f32> -> !torch.vtensor<[4,8],f32>
  %o = torch.aten.mm %h, %t1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,8],f32> -> !torch.vtensor<[5,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %o, %none : !torch.vtensor<[5,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g0 = "pock.grad"(%loss, %p0) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %g1 = "pock.grad"(%loss, %p1) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %n0:2 = "pock.sgd_momentum"(%p0, %g0, %m0, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[4,3],f32>, !torch.vtensor<[4,3],f32>)
  %n1:2 = "pock.sgd_momentum"(%p1, %g1, %m1, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>)
  return %loss, %n0#0, %n1#0, %n0#1, %n1#1 : !torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>, !torch.vtensor<[4,3],f32>, !torch.vtensor<[8,4],f32>
}
