// RUN: pock-opt %s -p 'pock-autodiff,pock-sparse-bp' | filecheck %s
// RUN: pock-opt %s -p 'pock-autodiff' | filecheck %s --check-prefix=AUTODIFF

// A frozen first layer: the only backward matmul is the second layer's weight gradient; no
// ReLU backward and no input gradient for the frozen layer.
// CHECK-LABEL: func.func @frozen_layer
// CHECK: torch.aten.mm {{.*}} -> !torch.vtensor<[5,4],f32>
// CHECK: torch.aten.mm {{.*}} -> !torch.vtensor<[5,2],f32>
// CHECK-NOT: threshold_backward
// CHECK-NOT: -> !torch.vtensor<[5,4],f32>
// CHECK: torch.aten.mm {{.*}} : !torch.vtensor<[2,5],f32>, !torch.vtensor<[5,4],f32> -> !torch.vtensor<[2,4],f32>
// CHECK-NOT: torch.aten.mm
// CHECK: return
func.func @frozen_layer(%w0: !torch.vtensor<[4,3],f32>, %w1: !torch.vtensor<[2,4],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "fc0.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "fc1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %h = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[5,4],f32>
  %r = torch.aten.relu %h : !torch.vtensor<[5,4],f32> -> !torch.vtensor<[5,4],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,2],f32>
  %o = torch.aten.mm %r, %t1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,2],f32> -> !torch.vtensor<[5,2],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %o, %none : !torch.vtensor<[5,2],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g1 = "pock.grad"(%loss, %p1) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  return %loss, %g1 : !torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>
}

// Half the output channels of fc1: pock-autodiff computes the full [8,4] weight gradient and
// slices it afterwards; pock-sparse-bp moves the slice before the matmul, which then yields
// the [4,4] gradient directly. The output cotangent is needed for the kept channels only, so
// even the ReLU backward runs on them (on a slice of the forward's ReLU output), and the bias
// gradient sums the same [5,4] cotangent.
// AUTODIFF-LABEL: func.func @channel_sparse_weight
// AUTODIFF: %[[GT:.*]] = torch.aten.transpose.int {{.*}} -> !torch.vtensor<[8,5],f32>
// AUTODIFF: %[[FULL:.*]] = torch.aten.mm %[[GT]], {{.*}} -> !torch.vtensor<[8,4],f32>
// AUTODIFF: "pock.channel_slice"(%[[FULL]]) {channels = 4 : i64} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[4,4],f32>
// CHECK-LABEL: func.func @channel_sparse_weight
// CHECK: %[[RELU:.*]] = torch.aten.relu {{.*}} -> !torch.vtensor<[5,8],f32>
// CHECK: %[[KEPT:.*]] = torch.aten.slice.Tensor %[[RELU]], {{.*}} -> !torch.vtensor<[5,4],f32>
// CHECK: %[[G:.*]] = torch.aten.threshold_backward %{{.*}}, %[[KEPT]], %{{.*}} -> !torch.vtensor<[5,4],f32>
// CHECK: %[[GB:.*]] = torch.aten.sum.dim_IntList %[[G]]{{.*}} -> !torch.vtensor<[1,4],f32>
// CHECK: %[[BIAS:.*]] = torch.aten.view %[[GB]]{{.*}} -> !torch.vtensor<[4],f32>
// CHECK: %[[GT:.*]] = torch.aten.transpose.int %[[G]], {{.*}} -> !torch.vtensor<[4,5],f32>
// CHECK: %[[W:.*]] = torch.aten.mm %[[GT]], {{.*}} : !torch.vtensor<[4,5],f32>, !torch.vtensor<[5,4],f32> -> !torch.vtensor<[4,4],f32>
// CHECK-NOT: pock.channel_slice
// CHECK-NOT: -> !torch.vtensor<[8,4],f32>
// CHECK: return %{{.*}}, %[[W]], %[[BIAS]] : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4],f32>
func.func @channel_sparse_weight(%w0: !torch.vtensor<[4,3],f32>, %w1: !torch.vtensor<[8,4],f32>, %b1: !torch.vtensor<[8],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "fc0.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "fc1.weight", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %q1 = "pock.param"(%b1) {param_name = "fc1.bias", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[8],f32>) -> !torch.vtensor<[8],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[4,3],f32> -> !torch.vtensor<[3,4],f32>
  %h = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[5,4],f32>
  %r = torch.aten.relu %h : !torch.vtensor<[5,4],f32> -> !torch.vtensor<[5,4],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[8,4],f32> -> !torch.vtensor<[4,8],f32>
  %m = torch.aten.mm %r, %t1 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,8],f32> -> !torch.vtensor<[5,8],f32>
  %int1 = torch.constant.int 1
  %o = torch.aten.add.Tensor %m, %q1, %int1 : !torch.vtensor<[5,8],f32>, !torch.vtensor<[8],f32>, !torch.int -> !torch.vtensor<[5,8],f32>
  %s = torch.aten.relu %o : !torch.vtensor<[5,8],f32> -> !torch.vtensor<[5,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %s, %none : !torch.vtensor<[5,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %gw = "pock.grad"(%loss, %p1) : (!torch.vtensor<[],f32>, !torch.vtensor<[8,4],f32>) -> !torch.vtensor<[4,4],f32>
  %gb = "pock.grad"(%loss, %q1) : (!torch.vtensor<[],f32>, !torch.vtensor<[8],f32>) -> !torch.vtensor<[4],f32>
  return %loss, %gw, %gb : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4],f32>
}

// Only the middle layer trains: the backward runs through the frozen top layer to reach it
// (its input gradient, [5,4]), but neither top nor bottom gets a weight gradient and no input
// gradient of the middle layer ([5,6]) is computed for the frozen layer below.
// CHECK-LABEL: func.func @lowest_updated_layer
// CHECK: torch.aten.mm {{.*}} -> !torch.vtensor<[5,2],f32>
// CHECK: torch.aten.mm {{.*}} : !torch.vtensor<[5,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[5,4],f32>
// CHECK-NOT: -> !torch.vtensor<[5,6],f32>
// CHECK-NOT: -> !torch.vtensor<[4,2],f32>
// CHECK: torch.aten.mm {{.*}} : !torch.vtensor<[4,5],f32>, !torch.vtensor<[5,6],f32> -> !torch.vtensor<[4,6],f32>
// CHECK-NOT: torch.aten.mm
// CHECK: return
func.func @lowest_updated_layer(%w0: !torch.vtensor<[6,3],f32>, %w1: !torch.vtensor<[4,6],f32>, %w2: !torch.vtensor<[2,4],f32>, %x: !torch.vtensor<[5,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,6],f32>) {
  %p0 = "pock.param"(%w0) {param_name = "fc0.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[6,3],f32>) -> !torch.vtensor<[6,3],f32>
  %p1 = "pock.param"(%w1) {param_name = "fc1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,6],f32>) -> !torch.vtensor<[4,6],f32>
  %p2 = "pock.param"(%w2) {param_name = "fc2.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %t0 = torch.aten.t %p0 : !torch.vtensor<[6,3],f32> -> !torch.vtensor<[3,6],f32>
  %h0 = torch.aten.mm %x, %t0 : !torch.vtensor<[5,3],f32>, !torch.vtensor<[3,6],f32> -> !torch.vtensor<[5,6],f32>
  %r0 = torch.aten.relu %h0 : !torch.vtensor<[5,6],f32> -> !torch.vtensor<[5,6],f32>
  %t1 = torch.aten.t %p1 : !torch.vtensor<[4,6],f32> -> !torch.vtensor<[6,4],f32>
  %h1 = torch.aten.mm %r0, %t1 : !torch.vtensor<[5,6],f32>, !torch.vtensor<[6,4],f32> -> !torch.vtensor<[5,4],f32>
  %r1 = torch.aten.relu %h1 : !torch.vtensor<[5,4],f32> -> !torch.vtensor<[5,4],f32>
  %t2 = torch.aten.t %p2 : !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,2],f32>
  %o = torch.aten.mm %r1, %t2 : !torch.vtensor<[5,4],f32>, !torch.vtensor<[4,2],f32> -> !torch.vtensor<[5,2],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %o, %none : !torch.vtensor<[5,2],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g1 = "pock.grad"(%loss, %p1) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,6],f32>) -> !torch.vtensor<[4,6],f32>
  return %loss, %g1 : !torch.vtensor<[],f32>, !torch.vtensor<[4,6],f32>
}

// A channel-sparse convolution weight: the slice crosses the abstract weight gradient
// (convolution_backward asking for the weight gradient only), which then runs on g's kept output
// channels and a slice of the weight, giving the [2,3,3,3] gradient directly; the ReLU backward
// above it runs on the kept channels too.
// AUTODIFF-LABEL: func.func @channel_sparse_conv_weight
// AUTODIFF: %{{.*}}, %[[FULL:.*]], %{{.*}} = torch.aten.convolution_backward {{.*}} -> !torch.none, !torch.vtensor<[4,3,3,3],f32>, !torch.none
// AUTODIFF: "pock.channel_slice"
// CHECK-LABEL: func.func @channel_sparse_conv_weight
// CHECK: %[[W:.*]] = torch.aten.slice.Tensor %{{.*}} -> !torch.vtensor<[2,3,3,3],f32>
// CHECK: %[[G:.*]] = torch.aten.threshold_backward {{.*}} -> !torch.vtensor<[2,2,8,8],f32>
// CHECK: %{{.*}}, %[[GW:.*]], %{{.*}} = torch.aten.convolution_backward %[[G]], %{{.*}}, %[[W]], {{.*}} -> !torch.none, !torch.vtensor<[2,3,3,3],f32>, !torch.none
// CHECK-NOT: pock.channel_slice
// CHECK-NOT: -> !torch.none, !torch.vtensor<[4,3,3,3],f32>, !torch.none
// CHECK: return
func.func @channel_sparse_conv_weight(%x: !torch.vtensor<[2,3,8,8],f32>, %w: !torch.vtensor<[4,3,3,3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,3,3],f32>) {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %none = torch.constant.none
  %stride = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %p, %none, %stride, %pad, %dil, %false, %outpad, %int1 : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[4,3,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %r = torch.aten.relu %y : !torch.vtensor<[2,4,8,8],f32> -> !torch.vtensor<[2,4,8,8],f32>
  %loss = torch.aten.sum %r, %none : !torch.vtensor<[2,4,8,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[2,3,3,3],f32>
  return %loss, %g : !torch.vtensor<[],f32>, !torch.vtensor<[2,3,3,3],f32>
}
