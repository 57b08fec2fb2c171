// RUN: pock-opt %s --split-input-file -p pock-autodiff,pock-dce | filecheck %s

// Convolution rules (pock_mlir/autodiff/rules/conv.py): the weight gradient is im2col (two
// unfolds) and one batched matmul over every image and position, not a batch-grouped
// convolution; the input gradient is a matmul to columns and col2im (shifted slices summed).

// CHECK-LABEL: func.func @conv2d_weight_and_input_gradients
// CHECK: %[[ROWS:.*]] = torch.aten.unfold %{{.*}} : !torch.vtensor<[2,3,10,10],f32>, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,3,8,10,3],f32>
// CHECK: %[[PATCHES:.*]] = torch.aten.unfold %[[ROWS]], {{.*}} -> !torch.vtensor<[2,3,8,8,3,3],f32>
// CHECK: %[[WGRAD:.*]] = torch.aten.bmm %{{.*}}, %{{.*}} : !torch.vtensor<[1,4,128],f32>, !torch.vtensor<[1,128,27],f32> -> !torch.vtensor<[1,4,27],f32>
// CHECK: torch.aten.view %[[WGRAD]], {{.*}} -> !torch.vtensor<[4,3,3,3],f32>
// CHECK-NOT: torch.aten.convolution
// CHECK: return

func.func @conv2d_weight_and_input_gradients(%x: !torch.vtensor<[2,3,8,8],f32>, %w: !torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32> {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32>
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %stride = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %p, %none, %stride, %pad, %dil, %false, %outpad, %int1 : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[4,3,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,4,8,8],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32>
  return %g : !torch.vtensor<[4,3,3,3],f32>
}

// -----

// The weight is frozen, so only the input gradient is built: columns by matmul, then col2im.
// CHECK-LABEL: func.func @conv2d_input_gradient_when_the_input_needs_one
// CHECK: %[[COLS:.*]] = torch.aten.bmm %{{.*}}, %{{.*}} : !torch.vtensor<[1,128,4],f32>, !torch.vtensor<[1,4,27],f32> -> !torch.vtensor<[1,128,27],f32>
// CHECK: torch.aten.view %[[COLS]], {{.*}} -> !torch.vtensor<[1,2,8,8,3,9],f32>
// CHECK: %[[TAP:.*]] = torch.aten.select.int {{.*}} : !torch.vtensor<[2,3,9,12,12],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,3,12,12],f32>
// CHECK: torch.aten.slice.Tensor %[[TAP]]
// CHECK: torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[2,3,10,10],f32>
// CHECK-NOT: torch.aten.unfold
// CHECK: return

func.func @conv2d_input_gradient_when_the_input_needs_one(%x0: !torch.vtensor<[2,3,8,8],f32>, %w: !torch.vtensor<[4,3,3,3],f32>, %s: !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32> {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32>
  %q = "pock.param"(%s) {param_name = "shift", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  %one = torch.constant.int 1
  %x = torch.aten.add.Tensor %x0, %q, %one : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[2,3,8,8],f32>, !torch.int -> !torch.vtensor<[2,3,8,8],f32>
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %false = torch.constant.bool false
  %stride = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %p, %none, %stride, %pad, %dil, %false, %outpad, %int1 : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[4,3,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,4,8,8],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %q) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  return %g : !torch.vtensor<[2,3,8,8],f32>
}
