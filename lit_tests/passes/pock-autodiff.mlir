// RUN: pock-opt --split-input-file --verify-diagnostics -p pock-autodiff %s | filecheck %s

// The loss seed is ones: full([], 1.0) viewed and expanded to the summed shape. The gradient
// of x @ w with respect to w is transpose(x) @ seed.

// CHECK-LABEL: func.func @grad_of_mm_is_mm_with_transposes
// CHECK-SAME: (%[[X:.*]]: !torch.vtensor<[2,3],f32>, %[[W:.*]]: !torch.vtensor<[3,4],f32>)
// CHECK: %[[P:.*]] = "pock.param"(%[[W]])
// CHECK: %[[Y:.*]] = torch.aten.mm %[[X]], %[[P]]
// CHECK: torch.aten.sum %[[Y]]
// CHECK: %[[ONE:.*]] = torch.constant.float 1.000000e+00
// CHECK: %[[FULL:.*]] = torch.aten.full %{{.*}}, %[[ONE]], {{.*}} -> !torch.vtensor<[],f32>
// CHECK: %[[VIEW:.*]] = torch.aten.view %[[FULL]], {{.*}} -> !torch.vtensor<[1,1],f32>
// CHECK: %[[SEED:.*]] = torch.aten.expand %[[VIEW]], {{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK: %[[XT:.*]] = torch.aten.transpose.int %[[X]], %{{.*}}, %{{.*}} : !torch.vtensor<[2,3],f32>, !torch.int, !torch.int -> !torch.vtensor<[3,2],f32>
// CHECK: %[[GW:.*]] = torch.aten.mm %[[XT]], %[[SEED]] : !torch.vtensor<[3,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[3,4],f32>
// CHECK-NOT: pock.grad
// CHECK: return %[[GW]]
func.func @grad_of_mm_is_mm_with_transposes(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32>
  %y = torch.aten.mm %x, %p : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32>
  return %g : !torch.vtensor<[3,4],f32>
}

// -----

// A linear layer multiplies by a transposed weight: the weight gradient is built as seed^T x,
// one matmul in the weight's own [out, in] layout, not as (x^T seed)^T.

// CHECK-LABEL: func.func @linear_weight_grad_in_weight_layout
// CHECK-SAME: (%[[X:.*]]: !torch.vtensor<[2,3],f32>, %[[W:.*]]: !torch.vtensor<[4,3],f32>)
// CHECK: %[[SEED:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK: %[[ST:.*]] = torch.aten.transpose.int %[[SEED]], {{.*}} -> !torch.vtensor<[4,2],f32>
// CHECK: %[[GW:.*]] = torch.aten.mm %[[ST]], %[[X]] : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,3],f32> -> !torch.vtensor<[4,3],f32>
// CHECK-NOT: torch.aten.t
// CHECK: return %[[GW]]
func.func @linear_weight_grad_in_weight_layout(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %t = torch.aten.t %p : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %y = torch.aten.mm %x, %t : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  return %g : !torch.vtensor<[4,3],f32>
}

// -----

// aten.t leaves a vector as it is, and so does its gradient.

// CHECK-LABEL: func.func @t_of_vector_passes_the_gradient_through
// CHECK-SAME: (%[[W:.*]]: !torch.vtensor<[4],f32>, %[[X:.*]]: !torch.vtensor<[4],f32>)
// CHECK: %[[SEED:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[4],f32>
// CHECK: %[[G:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[X]]
// CHECK-NOT: transpose
// CHECK: return %[[G]]
func.func @t_of_vector_passes_the_gradient_through(%w: !torch.vtensor<[4],f32>, %x: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %t = torch.aten.t %p : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %m = torch.aten.mul.Tensor %t, %x : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %m, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

// CHECK-LABEL: func.func @relu_gives_threshold_backward
// CHECK: %[[P:.*]] = "pock.param"
// CHECK: %[[RELU:.*]] = torch.aten.relu %[[P]]
// CHECK: %[[SEED:.*]] = torch.aten.expand
// CHECK: %[[ZERO:.*]] = torch.constant.int 0
// CHECK: %[[G:.*]] = torch.aten.threshold_backward %[[SEED]], %[[RELU]], %[[ZERO]]
// CHECK: return %[[G]]
func.func @relu_gives_threshold_backward(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "bias", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %r = torch.aten.relu %p : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %r, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

// The loss is sum(used): the gradient of `used` is the seed itself, `unused` gets zeros.

// CHECK-LABEL: func.func @unused_parameter_gets_zeros
// CHECK: %[[SEED:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[4],f32>
// CHECK: %[[ZERO:.*]] = torch.constant.float 0.000000e+00
// CHECK: %[[ZEROS:.*]] = torch.aten.full %{{.*}}, %[[ZERO]], {{.*}} -> !torch.vtensor<[4],f32>
// CHECK: return %[[SEED]], %[[ZEROS]]
func.func @unused_parameter_gets_zeros(%a: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %pa = "pock.param"(%a) {param_name = "used", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %pb = "pock.param"(%b) {param_name = "unused", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %pa, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %ga = "pock.grad"(%loss, %pa) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %gb = "pock.grad"(%loss, %pb) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %ga, %gb : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// One seed feeds both gradients: d(a*b)/da = seed*b and d(a*b)/db = seed*a.

// CHECK-LABEL: func.func @two_grads_share_one_sweep
// CHECK: %[[A:.*]] = "pock.param"{{.*}}param_name = "a"
// CHECK: %[[B:.*]] = "pock.param"{{.*}}param_name = "b"
// CHECK: %[[SEED:.*]] = torch.aten.expand
// CHECK-NOT: torch.aten.full
// CHECK: %[[GA:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[B]]
// CHECK: %[[GB:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[A]]
// CHECK: return %[[GA]], %[[GB]]
func.func @two_grads_share_one_sweep(%a: !torch.vtensor<[4],f32>, %b: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %pa = "pock.param"(%a) {param_name = "a", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %pb = "pock.param"(%b) {param_name = "b", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %prod = torch.aten.mul.Tensor %pa, %pb : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %prod, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %ga = "pock.grad"(%loss, %pa) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %gb = "pock.grad"(%loss, %pb) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %ga, %gb : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// Each loss gets its own sweep, seeded by its own ones.

// CHECK-LABEL: func.func @two_losses_get_two_sweeps
// CHECK: %[[W:.*]] = "pock.param"
// CHECK: %[[SEED1:.*]] = torch.aten.expand
// CHECK: %[[SEED2:.*]] = torch.aten.expand
// CHECK: %[[G2_LHS:.*]] = torch.aten.mul.Tensor %[[SEED2]], %[[W]]
// CHECK: %[[G2_RHS:.*]] = torch.aten.mul.Tensor %[[SEED2]], %[[W]]
// CHECK: %[[G2:.*]] = torch.aten.add.Tensor %[[G2_LHS]], %[[G2_RHS]]
// CHECK: return %[[SEED1]], %[[G2]]
func.func @two_losses_get_two_sweeps(%w: !torch.vtensor<[4],f32>) -> (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %linear = torch.aten.sum %p, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %sq = torch.aten.mul.Tensor %p, %p : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %quadratic = torch.aten.sum %sq, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g1 = "pock.grad"(%linear, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %g2 = "pock.grad"(%quadratic, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g1, %g2 : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}

// -----

// w * w: the cotangents reaching w through both operands are added.

// CHECK-LABEL: func.func @reused_parameter_accumulates
// CHECK: %[[P:.*]] = "pock.param"
// CHECK: %[[SEED:.*]] = torch.aten.expand
// CHECK: %[[G_LHS:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[P]]
// CHECK: %[[G_RHS:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[P]]
// CHECK: %[[G:.*]] = torch.aten.add.Tensor %[[G_LHS]], %[[G_RHS]]
// CHECK: return %[[G]]
func.func @reused_parameter_accumulates(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %sq = torch.aten.mul.Tensor %p, %p : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %sq, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

// A pock.grad covering fewer channels than its parameter gets the leading rows of the full
// gradient, as a pock.channel_slice that pock-sparse-bp can move into the backward ops.

// CHECK-LABEL: func.func @channel_grad_is_leading_slice
// CHECK: %[[GW:.*]] = torch.aten.mm {{.*}} -> !torch.vtensor<[3,8],f32>
// CHECK: %[[SLICE:.*]] = "pock.channel_slice"(%[[GW]]) {channels = 1 : i64} : (!torch.vtensor<[3,8],f32>) -> !torch.vtensor<[1,8],f32>
// CHECK: return %[[SLICE]]
func.func @channel_grad_is_leading_slice(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,8],f32>) -> !torch.vtensor<[1,8],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "channels", ratio = 0.25 : f64} : (!torch.vtensor<[3,8],f32>) -> !torch.vtensor<[3,8],f32>
  %y = torch.aten.mm %x, %p : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,8],f32> -> !torch.vtensor<[2,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3,8],f32>) -> !torch.vtensor<[1,8],f32>
  return %g : !torch.vtensor<[1,8],f32>
}

// -----

// erfinv has no derivative rule, but it only reads an input, so it is never differentiated.

// CHECK-LABEL: func.func @op_without_rule_off_the_gradient_path
// CHECK: %[[P:.*]] = "pock.param"
// CHECK: %[[FROZEN:.*]] = torch.aten.erfinv
// CHECK: %[[SEED:.*]] = torch.aten.expand
// CHECK: %[[G:.*]] = torch.aten.mul.Tensor %[[SEED]], %[[FROZEN]]
// CHECK: return %[[G]]
func.func @op_without_rule_off_the_gradient_path(%x: !torch.vtensor<[4],f32>, %w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %frozen = torch.aten.erfinv %x : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %y = torch.aten.mul.Tensor %frozen, %p : !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

func.func @op_without_rule_on_the_gradient_path(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  // expected-error @+1 {{no derivative rule for torch.aten.erfinv {{.*}} the gradients of fc.weight need it}}
  %y = torch.aten.erfinv %p : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

// A call is not differentiated through: the message says to inline first.

func.func private @scaled(%v: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %c = torch.constant.float 2.0
  %r = torch.aten.mul.Scalar %v, %c : !torch.vtensor<[4],f32>, !torch.float -> !torch.vtensor<[4],f32>
  return %r : !torch.vtensor<[4],f32>
}

func.func @call_needs_inlining(%w: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  // expected-error @+1 {{cannot differentiate through the call to @scaled (at {{.*}}pock-autodiff.mlir:{{[0-9]+}}): run the 'inline' pass before pock-autodiff}}
  %y = func.call @scaled(%p) : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %g : !torch.vtensor<[4],f32>
}

// -----

// Hand-written IR whose op does not fit its own result (a 5x5 average pool of a 4x4 input
// declared to give 1x1) is an error at the op, not an internal error.
func.func @avg_pool_result_does_not_fit(%x: !torch.vtensor<[1,1,4,4],f32>, %w: !torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int5 = torch.constant.int 5
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %none = torch.constant.none
  %s = torch.aten.mul.Tensor %x, %p : !torch.vtensor<[1,1,4,4],f32>, !torch.vtensor<[1],f32> -> !torch.vtensor<[1,1,4,4],f32>
  %k = torch.prim.ListConstruct %int5, %int5 : (!torch.int, !torch.int) -> !torch.list<int>
  %st = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pd = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error @+1 {{torch.aten.avg_pool2d (at {{.*}}): its operands and result do not fit each other, so it cannot be differentiated: a [5, 5] window over [4, 4] gives [0, 0], not the declared [1, 1]}}
  %y = torch.aten.avg_pool2d %s, %k, %st, %pd, %false, %true, %none : !torch.vtensor<[1,1,4,4],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[1,1,1,1],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[1,1,1,1],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32>
  return %g : !torch.vtensor<[1],f32>
}

// -----

// A zero kernel would divide by zero (inf constants in the backward): refused at the op.
func.func @avg_pool_kernel_zero(%x: !torch.vtensor<[1,1,4,4],f32>, %w: !torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %none = torch.constant.none
  %s = torch.aten.mul.Tensor %x, %p : !torch.vtensor<[1,1,4,4],f32>, !torch.vtensor<[1],f32> -> !torch.vtensor<[1,1,4,4],f32>
  %k = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %st = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pd = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error @+1 {{torch.aten.avg_pool2d (at {{.*}}): its operands and result do not fit each other, so it cannot be differentiated: kernel [0, 0], stride [1, 1] and divisor_override None must be positive}}
  %y = torch.aten.avg_pool2d %s, %k, %st, %pd, %false, %true, %none : !torch.vtensor<[1,1,4,4],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[1,1,5,5],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[1,1,5,5],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[1],f32>) -> !torch.vtensor<[1],f32>
  return %g : !torch.vtensor<[1],f32>
}
