// RUN: pock-opt -p pock-lower-optimizers %s | filecheck %s

// The updates follow torch.optim.SGD and torch.optim.AdamW step by step.

// new = w - lr * g
// CHECK-LABEL: func.func @sgd(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>)
// CHECK: %[[LR:.*]] = torch.constant.float 1.000000e-01
// CHECK: %[[STEP:.*]] = torch.aten.mul.Scalar %[[G]], %[[LR]]
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[W]], %[[STEP]], %{{.*}}
// CHECK-NOT: pock.sgd
// CHECK: return %[[NEW]]
func.func @sgd(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %n = "pock.sgd"(%w, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}

// new = w - lr * (g + wd * w)
// CHECK-LABEL: func.func @sgd_weight_decay(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>)
// CHECK: %[[WD:.*]] = torch.constant.float 1.000000e-02
// CHECK: %[[DECAY:.*]] = torch.aten.mul.Scalar %[[W]], %[[WD]]
// CHECK: %[[DIR:.*]] = torch.aten.add.Tensor %[[G]], %[[DECAY]], %{{.*}}
// CHECK: %[[LR:.*]] = torch.constant.float 1.000000e-01
// CHECK: %[[STEP:.*]] = torch.aten.mul.Scalar %[[DIR]], %[[LR]]
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[W]], %[[STEP]], %{{.*}}
// CHECK: return %[[NEW]]
func.func @sgd_weight_decay(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %n = "pock.sgd"(%w, %g) {lr = 0.1 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}

// buf' = momentum * buf + g; new = w - lr * buf'
// CHECK-LABEL: func.func @sgd_momentum(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>, %[[BUF:.*]]: !torch.vtensor<[3],f32>, %[[T:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[MOMENTUM:.*]] = torch.constant.float 9.000000e-01
// CHECK: %[[KEPT:.*]] = torch.aten.mul.Scalar %[[BUF]], %[[MOMENTUM]]
// CHECK: %[[NEW_BUF:.*]] = torch.aten.add.Tensor %[[KEPT]], %[[G]], %{{.*}}
// CHECK: %[[LR:.*]] = torch.constant.float 1.000000e-01
// CHECK: %[[STEP:.*]] = torch.aten.mul.Scalar %[[NEW_BUF]], %[[LR]]
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[W]], %[[STEP]], %{{.*}}
// CHECK: return %[[NEW]], %[[NEW_BUF]]
func.func @sgd_momentum(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>, %buf: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %n:2 = "pock.sgd_momentum"(%w, %g, %buf, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return %n#0, %n#1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// With dampening the first step (t == 0) starts the buffer at the undamped gradient, as torch does.
// CHECK-LABEL: func.func @sgd_momentum_dampening(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>, %[[BUF:.*]]: !torch.vtensor<[3],f32>, %[[T:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[KEPT:.*]] = torch.aten.mul.Scalar %[[BUF]], %{{.*}}
// CHECK: %[[ONE_MINUS_DAMPENING:.*]] = torch.constant.float 5.000000e-01
// CHECK: %[[DAMPED:.*]] = torch.aten.mul.Scalar %[[G]], %[[ONE_MINUS_DAMPENING]]
// CHECK: %[[ACCUMULATED:.*]] = torch.aten.add.Tensor %[[KEPT]], %[[DAMPED]], %{{.*}}
// CHECK: %[[ZERO:.*]] = torch.constant.int 0
// CHECK: %[[FIRST:.*]] = torch.aten.eq.Scalar %[[T]], %[[ZERO]]
// CHECK: %[[NEW_BUF:.*]] = torch.aten.where.self %[[FIRST]], %[[G]], %[[ACCUMULATED]]
// CHECK: %[[STEP:.*]] = torch.aten.mul.Scalar %[[NEW_BUF]], %{{.*}}
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[W]], %[[STEP]], %{{.*}}
// CHECK: return %[[NEW]], %[[NEW_BUF]]
func.func @sgd_momentum_dampening(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>, %buf: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %n:2 = "pock.sgd_momentum"(%w, %g, %buf, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.5 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return %n#0, %n#1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// Nesterov steps along g + momentum * buf' instead of buf'.
// CHECK-LABEL: func.func @sgd_momentum_nesterov(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>, %[[BUF:.*]]: !torch.vtensor<[3],f32>, %[[T:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[NEW_BUF:.*]] = torch.aten.add.Tensor %{{.*}}, %[[G]], %{{.*}}
// CHECK: %[[MOMENTUM:.*]] = torch.constant.float 9.000000e-01
// CHECK: %[[LOOKAHEAD:.*]] = torch.aten.mul.Scalar %[[NEW_BUF]], %[[MOMENTUM]]
// CHECK: %[[DIR:.*]] = torch.aten.add.Tensor %[[G]], %[[LOOKAHEAD]], %{{.*}}
// CHECK: %[[STEP:.*]] = torch.aten.mul.Scalar %[[DIR]], %{{.*}}
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[W]], %[[STEP]], %{{.*}}
// CHECK: return %[[NEW]], %[[NEW_BUF]]
func.func @sgd_momentum_nesterov(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>, %buf: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %n:2 = "pock.sgd_momentum"(%w, %g, %buf, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = true} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return %n#0, %n#1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// t = step + 1
// m' = beta1 * m + (1 - beta1) * g;  v' = beta2 * v + (1 - beta2) * g * g
// new = w * (1 - lr * wd) - lr / (1 - beta1^t) * m' / (sqrt(v') / sqrt(1 - beta2^t) + eps)
// CHECK-LABEL: func.func @adamw(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[G:.*]]: !torch.vtensor<[3],f32>, %[[M:.*]]: !torch.vtensor<[3],f32>, %[[V:.*]]: !torch.vtensor<[3],f32>, %[[T:.*]]: !torch.vtensor<[],f32>)
// CHECK: %[[T1:.*]] = torch.aten.add.Scalar %[[T]], %{{.*}}
// CHECK: %[[ONE_MINUS_LR_WD:.*]] = torch.constant.float 9.999900e-01
// CHECK: %[[DECAYED:.*]] = torch.aten.mul.Scalar %[[W]], %[[ONE_MINUS_LR_WD]]
// CHECK: %[[BETA1:.*]] = torch.constant.float 9.000000e-01
// CHECK: %[[M_KEPT:.*]] = torch.aten.mul.Scalar %[[M]], %[[BETA1]]
// CHECK: %[[M_NEW_PART:.*]] = torch.aten.mul.Scalar %[[G]], %{{.*}}
// CHECK: %[[NEW_M:.*]] = torch.aten.add.Tensor %[[M_KEPT]], %[[M_NEW_PART]], %{{.*}}
// CHECK: %[[BETA2:.*]] = torch.constant.float 0.99899999999999999
// CHECK: %[[V_KEPT:.*]] = torch.aten.mul.Scalar %[[V]], %[[BETA2]]
// CHECK: %[[G_SQ:.*]] = torch.aten.mul.Tensor %[[G]], %[[G]]
// CHECK: %[[V_NEW_PART:.*]] = torch.aten.mul.Scalar %[[G_SQ]], %{{.*}}
// CHECK: %[[NEW_V:.*]] = torch.aten.add.Tensor %[[V_KEPT]], %[[V_NEW_PART]], %{{.*}}
// CHECK: %[[BETA1_POW:.*]] = torch.aten.pow.Scalar %{{.*}}, %[[T1]]
// CHECK: %[[BC1:.*]] = torch.aten.rsub.Scalar %[[BETA1_POW]], %{{.*}}, %{{.*}}
// CHECK: %[[BETA2_POW:.*]] = torch.aten.pow.Scalar %{{.*}}, %[[T1]]
// CHECK: %[[BC2:.*]] = torch.aten.rsub.Scalar %[[BETA2_POW]], %{{.*}}, %{{.*}}
// CHECK: %[[SQRT_V:.*]] = torch.aten.sqrt %[[NEW_V]]
// CHECK: %[[SQRT_BC2:.*]] = torch.aten.sqrt %[[BC2]]
// CHECK: %[[V_HAT:.*]] = torch.aten.div.Tensor %[[SQRT_V]], %[[SQRT_BC2]]
// CHECK: %[[EPS:.*]] = torch.constant.float 1.000000e-08
// CHECK: %[[DENOM:.*]] = torch.aten.add.Scalar %[[V_HAT]], %[[EPS]], %{{.*}}
// CHECK: %[[LR:.*]] = torch.constant.float 1.000000e-03
// CHECK: %[[LR_TENSOR:.*]] = torch.aten.full %{{.*}}, %[[LR]], {{.*}} -> !torch.vtensor<[],f32>
// CHECK: %[[STEP_SIZE:.*]] = torch.aten.div.Tensor %[[LR_TENSOR]], %[[BC1]]
// CHECK: %[[RATIO:.*]] = torch.aten.div.Tensor %[[NEW_M]], %[[DENOM]]
// CHECK: %[[UPDATE:.*]] = torch.aten.mul.Tensor %[[STEP_SIZE]], %[[RATIO]]
// CHECK: %[[NEW:.*]] = torch.aten.sub.Tensor %[[DECAYED]], %[[UPDATE]], %{{.*}}
// CHECK: return %[[NEW]], %[[NEW_M]], %[[NEW_V]]
func.func @adamw(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[3],f32>, %m: !torch.vtensor<[3],f32>, %v: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %n:3 = "pock.adamw"(%w, %g, %m, %v, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return %n#0, %n#1, %n#2 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// channel_slice reads rows [0, 2) of dim 0; channel_update writes them back into the full tensor.
// CHECK-LABEL: func.func @channel_slice_and_update(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[8,3],f32>, %[[G:.*]]: !torch.vtensor<[2,3],f32>)
// CHECK: %[[DIM:.*]] = torch.constant.int 0
// CHECK: %[[START:.*]] = torch.constant.int 0
// CHECK: %[[END:.*]] = torch.constant.int 2
// CHECK: %[[STRIDE:.*]] = torch.constant.int 1
// CHECK: %[[ROWS:.*]] = torch.aten.slice.Tensor %[[W]], %[[DIM]], %[[START]], %[[END]], %[[STRIDE]] : {{.*}} -> !torch.vtensor<[2,3],f32>
// CHECK: %[[NEW_ROWS:.*]] = torch.aten.sub.Tensor %[[ROWS]], %{{.*}}, %{{.*}}
// CHECK: %[[DIM2:.*]] = torch.constant.int 0
// CHECK: %[[START2:.*]] = torch.constant.int 0
// CHECK: %[[END2:.*]] = torch.constant.int 2
// CHECK: %[[STRIDE2:.*]] = torch.constant.int 1
// CHECK: %[[NEW:.*]] = torch.aten.slice_scatter %[[W]], %[[NEW_ROWS]], %[[DIM2]], %[[START2]], %[[END2]], %[[STRIDE2]] : {{.*}} -> !torch.vtensor<[8,3],f32>
// CHECK-NOT: pock.
// CHECK: return %[[NEW]]
func.func @channel_slice_and_update(%w: !torch.vtensor<[8,3],f32>, %g: !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32> {
  %s = "pock.channel_slice"(%w) {channels = 2 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[2,3],f32>
  %n = "pock.sgd"(%s, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[2,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  %u = "pock.channel_update"(%w, %n) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[8,3],f32>
  return %u : !torch.vtensor<[8,3],f32>
}

// pock.param and pock.grad are left for pock-strip-params and pock-autodiff.
// CHECK-LABEL: func.func @param_and_grad_untouched
// CHECK: %[[P:.*]] = "pock.param"
// CHECK: %[[G:.*]] = "pock.grad"(%{{.*}}, %[[P]])
// CHECK: return %[[G]]
func.func @param_and_grad_untouched(%w: !torch.vtensor<[3],f32>, %loss: !torch.vtensor<[],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %g : !torch.vtensor<[3],f32>
}
