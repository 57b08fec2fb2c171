// RUN: pock-opt %s --split-input-file -p pock-autodiff,pock-dce | filecheck %s
// RUN: pock-opt %s --split-input-file -p 'pock-autodiff,pock-dce,pock-backend-switch{target=cuda}' | filecheck %s --check-prefix=FORMS

// Convolution rules (pock_mlir/autodiff/rules/conv.py): a convolution's backward is one abstract
// aten.convolution_backward per gradient, its mask asking for that gradient only. Prefix FORMS,
// the baseline forms pock-backend-switch gives them without measurements (conv_forms.py):
// the weight gradient is im2col (two unfolds) and one batched matmul over every image and
// position, not a batch-grouped convolution; the input gradient is a matmul to columns and
// col2im (shifted slices summed). Then depthwise and strided convs, max pooling, ReLU6, average
// pooling and train-mode BatchNorm.

// The input is an argument, so only the weight gradient is asked for.
// CHECK-LABEL: func.func @conv2d_weight_and_input_gradients
// CHECK: %[[MASK:.*]] = torch.prim.ListConstruct %false{{.*}}, %true{{.*}}, %false{{.*}} : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
// CHECK: %{{.*}}, %[[WGRAD:.*]], %{{.*}} = torch.aten.convolution_backward {{.*}}, %[[MASK]] : {{.*}} -> !torch.none, !torch.vtensor<[4,3,3,3],f32>, !torch.none
// CHECK: torch.aten.view %[[WGRAD]]
// CHECK: return
// FORMS-LABEL: func.func @conv2d_weight_and_input_gradients
// FORMS: %[[ROWS:.*]] = torch.aten.unfold %{{.*}} : !torch.vtensor<[2,3,10,10],f32>, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,3,8,10,3],f32>
// FORMS: %[[PATCHES:.*]] = torch.aten.unfold %[[ROWS]], {{.*}} -> !torch.vtensor<[2,3,8,8,3,3],f32>
// FORMS: %[[WGRAD:.*]] = torch.aten.bmm %{{.*}}, %{{.*}} {pock.backend = "im2col", pock.backend_reason = "weight_grad dense 3x3/s1 3->4 8x8 n2: no measurements for target 'cuda' {{.*}}"} : !torch.vtensor<[1,4,128],f32>, !torch.vtensor<[1,128,27],f32> -> !torch.vtensor<[1,4,27],f32>
// FORMS: torch.aten.view %[[WGRAD]], {{.*}} -> !torch.vtensor<[4,3,3,3],f32>
// FORMS-NOT: torch.aten.convolution_backward
// FORMS: return

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
// CHECK: %[[MASK:.*]] = torch.prim.ListConstruct %true{{.*}}, %false{{.*}}, %false{{.*}} : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
// CHECK: %[[XGRAD:.*]], %{{.*}}, %{{.*}} = torch.aten.convolution_backward {{.*}}, %[[MASK]] : {{.*}} -> !torch.vtensor<[2,3,8,8],f32>, !torch.none, !torch.none
// CHECK-NOT: torch.aten.convolution_backward
// CHECK: return
// FORMS-LABEL: func.func @conv2d_input_gradient_when_the_input_needs_one
// FORMS: %[[COLS:.*]] = torch.aten.bmm %{{.*}}, %{{.*}} {pock.backend = "im2col", {{.*}}} : !torch.vtensor<[1,128,4],f32>, !torch.vtensor<[1,4,27],f32> -> !torch.vtensor<[1,128,27],f32>
// FORMS: torch.aten.view %[[COLS]], {{.*}} -> !torch.vtensor<[1,2,8,8,3,9],f32>
// FORMS: %[[TAP:.*]] = torch.aten.select.int {{.*}} : !torch.vtensor<[2,3,9,12,12],f32>, !torch.int, !torch.int -> !torch.vtensor<[2,3,12,12],f32>
// FORMS: torch.aten.slice.Tensor %[[TAP]]
// FORMS: torch.aten.add.Tensor {{.*}} -> !torch.vtensor<[2,3,10,10],f32>
// FORMS-NOT: torch.aten.unfold
// FORMS: return

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

// -----

// A depthwise conv's weight gradient is a multiply-and-sum over images and positions of the
// unfolded input and g (no matmul: one channel per group).
// CHECK-LABEL: func.func @depthwise_weight_gradient_is_a_multiply_sum
// CHECK: torch.aten.convolution_backward {{.*}} -> !torch.none, !torch.vtensor<[4,1,3,3],f32>, !torch.none
// FORMS-LABEL: func.func @depthwise_weight_gradient_is_a_multiply_sum
// FORMS: %[[ROWS:.*]] = torch.aten.unfold {{.*}} -> !torch.vtensor<[2,4,4,10,3],f32>
// FORMS: %[[PATCHES:.*]] = torch.aten.unfold %[[ROWS]], {{.*}} -> !torch.vtensor<[2,4,4,4,3,3],f32>
// FORMS: %[[PER_CHANNEL:.*]] = torch.aten.permute %[[PATCHES]], {{.*}} -> !torch.vtensor<[4,3,3,2,4,4],f32>
// FORMS: %[[PRODUCT:.*]] = torch.aten.mul.Tensor %[[PER_CHANNEL]], %{{.*}} : !torch.vtensor<[4,3,3,2,4,4],f32>, !torch.vtensor<[4,1,1,2,4,4],f32>
// FORMS: torch.aten.sum.dim_IntList %[[PRODUCT]], {{.*}} -> !torch.vtensor<[4,3,3],f32>
// FORMS-NOT: torch.aten.bmm
// FORMS-NOT: torch.aten.convolution_backward
// FORMS: return

func.func @depthwise_weight_gradient_is_a_multiply_sum(%x: !torch.vtensor<[2,4,8,8],f32>, %w: !torch.vtensor<[4,1,3,3],f32>) -> !torch.vtensor<[4,1,3,3],f32> {
  %p = "pock.param"(%w) {param_name = "dw.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,1,3,3],f32>) -> !torch.vtensor<[4,1,3,3],f32>
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int4 = torch.constant.int 4
  %false = torch.constant.bool false
  %stride = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %p, %none, %stride, %pad, %dil, %false, %outpad, %int4 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[4,1,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,4,4],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,4,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,1,3,3],f32>) -> !torch.vtensor<[4,1,3,3],f32>
  return %g : !torch.vtensor<[4,1,3,3],f32>
}

// -----

// A stride-2 input gradient: g W as columns, each tap a shifted slice summed into its stride
// phase (row and column parity), the four phases interleaved by stack and view, then the
// padding cropped. No scatter, no zero-inserted g.
// CHECK-LABEL: func.func @strided_input_gradient_interleaves_stride_phases
// CHECK: torch.aten.convolution_backward {{.*}} -> !torch.vtensor<[2,3,8,8],f32>, !torch.none, !torch.none
// FORMS-LABEL: func.func @strided_input_gradient_interleaves_stride_phases
// FORMS: torch.aten.bmm %{{.*}}, %{{.*}} {pock.backend = "im2col", {{.*}}} : !torch.vtensor<[1,32,4],f32>, !torch.vtensor<[1,4,27],f32> -> !torch.vtensor<[1,32,27],f32>
// FORMS: torch.aten.constant_pad_nd {{.*}} -> !torch.vtensor<[2,3,9,6,6],f32>
// FORMS-COUNT-9: torch.aten.select.int
// FORMS: torch.aten.stack {{.*}} -> !torch.vtensor<[2,3,5,5,2],f32>
// FORMS: torch.aten.stack {{.*}} -> !torch.vtensor<[2,3,5,5,2],f32>
// FORMS: %[[PHASES:.*]] = torch.aten.stack {{.*}} -> !torch.vtensor<[2,3,5,2,5,2],f32>
// FORMS: %[[PADDED:.*]] = torch.aten.view %[[PHASES]], {{.*}} -> !torch.vtensor<[2,3,10,10],f32>
// FORMS: torch.aten.slice.Tensor %[[PADDED]], {{.*}} -> !torch.vtensor<[2,3,8,10],f32>
// FORMS-NOT: scatter
// FORMS: return

func.func @strided_input_gradient_interleaves_stride_phases(%x0: !torch.vtensor<[2,3,8,8],f32>, %w: !torch.vtensor<[4,3,3,3],f32>, %s: !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32> {
  %p = "pock.param"(%w) {param_name = "conv.weight", policy = "frozen", ratio = 1.0 : f64} : (!torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32>
  %q = "pock.param"(%s) {param_name = "shift", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %false = torch.constant.bool false
  %x = torch.aten.add.Tensor %x0, %q, %int1 : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[2,3,8,8],f32>, !torch.int -> !torch.vtensor<[2,3,8,8],f32>
  %stride = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.convolution %x, %p, %none, %stride, %pad, %dil, %false, %outpad, %int1 : !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[4,3,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,4,4],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,4,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %q) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  return %g : !torch.vtensor<[2,3,8,8],f32>
}

// -----

// Max pooling routes g to the forward's argmax indices with max_pool2d_with_indices_backward.
// CHECK-LABEL: func.func @max_pool_gradient_routes_through_the_forward_indices
// CHECK: %{{.*}}, %[[INDICES:.*]] = torch.aten.max_pool2d_with_indices
// CHECK: %[[G:.*]] = torch.aten.max_pool2d_with_indices_backward %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[INDICES]]
// CHECK: return %[[G]]

func.func @max_pool_gradient_routes_through_the_forward_indices(%w: !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32> {
  %p = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %false = torch.constant.bool false
  %kernel = torch.prim.ListConstruct %int3, %int3 : (!torch.int, !torch.int) -> !torch.list<int>
  %stride = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %y, %idx = torch.aten.max_pool2d_with_indices %p, %kernel, %stride, %pad, %dil, %false : !torch.vtensor<[2,3,8,8],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool -> !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],si64>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  return %g : !torch.vtensor<[2,3,8,8],f32>
}

// -----

// ReLU6 (hardtanh to [0, 6]) passes g where 0 < x < 6, read from the output, which is there exactly
// when x is: the backward keeps the output, which the next layer's weight gradient reads anyway,
// and not the input as well.
// CHECK-LABEL: func.func @relu6_gradient_reads_the_output
// CHECK: %[[X:.*]] = "pock.param"
// CHECK: %[[Y:.*]] = torch.aten.hardtanh %[[X]], %{{.*}}, %{{.*}}
// CHECK: %[[ABOVE:.*]] = torch.aten.gt.Scalar %[[Y]]
// CHECK: %[[BELOW:.*]] = torch.aten.lt.Scalar %[[Y]]
// CHECK: torch.aten.logical_and %[[ABOVE]], %[[BELOW]]
// CHECK-NOT: %[[X]]{{[ ,]}}
// CHECK: return

func.func @relu6_gradient_reads_the_output(%w: !torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32> {
  %p = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
  %none = torch.constant.none
  %false = torch.constant.bool false
  %float0 = torch.constant.float 0.000000e+00
  %float6 = torch.constant.float 6.000000e+00
  %y = torch.aten.hardtanh %p, %float0, %float6 : !torch.vtensor<[2,3,4,4],f32>, !torch.float, !torch.float -> !torch.vtensor<[2,3,4,4],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
  return %g : !torch.vtensor<[2,3,4,4],f32>
}

// -----

// Average pooling without counting padding: g times each window's 1/divisor (a constant: 1/4
// in the corner window, 1/6 on the edges, 1/9 inside), spread over the 9 taps and folded back.
// CHECK-LABEL: func.func @avg_pool_gradient_folds_g_over_each_window_divisor
// CHECK: %[[SCALE:.*]] = torch.vtensor.literal(dense<{{\[\[}}2.500000e-01, 0.166666672, 0.166666672, 0.166666672], [0.166666672, 0.111111112, {{.*}}> : tensor<4x4xf32>)
// CHECK: %[[SHARE:.*]] = torch.aten.mul.Tensor %{{.*}}, %[[SCALE]]
// CHECK: %[[TAPS:.*]] = torch.aten.unsqueeze %[[SHARE]]
// CHECK: torch.aten.expand %[[TAPS]], {{.*}} -> !torch.vtensor<[2,3,9,4,4],f32>
// CHECK: torch.aten.stack {{.*}} -> !torch.vtensor<[2,3,5,2,5,2],f32>
// CHECK: return

func.func @avg_pool_gradient_folds_g_over_each_window_divisor(%w: !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32> {
  %p = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %false = torch.constant.bool false
  %kernel = torch.prim.ListConstruct %int3, %int3 : (!torch.int, !torch.int) -> !torch.list<int>
  %stride = torch.prim.ListConstruct %int2, %int2 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %y = torch.aten.avg_pool2d %p, %kernel, %stride, %pad, %false, %false, %none : !torch.vtensor<[2,3,8,8],f32>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.bool, !torch.none -> !torch.vtensor<[2,3,4,4],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %y, %dims, %false, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%l, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,8,8],f32>) -> !torch.vtensor<[2,3,8,8],f32>
  return %g : !torch.vtensor<[2,3,8,8],f32>
}

// -----

// Train-mode BatchNorm, as the decomposition leaves it (var_mean, rsqrt, elementwise): the input
// gradient takes the paths through the batch mean (g summed and divided by the 32 values per
// channel) and the batch variance (rsqrt's -y^3/2, then 2 (x - mean) / 32).
// CHECK-LABEL: func.func @train_mode_batch_norm_gradient_flows_through_the_batch_statistics
// CHECK: %[[VAR:.*]], %[[MEAN:.*]] = torch.aten.var_mean.correction %[[X:.*]], %{{.*}}, %{{.*}}, %{{.*}}
// CHECK: %[[R:.*]] = torch.aten.rsqrt
// CHECK: %[[R2:.*]] = torch.aten.mul.Tensor %[[R]], %[[R]]
// CHECK: %[[R3:.*]] = torch.aten.mul.Tensor %[[R2]], %[[R]]
// CHECK: %[[GVAR0:.*]] = torch.aten.mul.Tensor %{{.*}}, %[[R3]]
// CHECK: %[[GVAR:.*]] = torch.aten.mul.Scalar %[[GVAR0]], %{{.*}} : !torch.vtensor<[1,3,1,1],f32>, !torch.float
// CHECK: torch.aten.div.Scalar %{{.*}}, %{{.*}} : !torch.vtensor<[2,3,4,4],f32>, !torch.float
// CHECK: torch.aten.sub.Tensor %[[X]], %{{.*}}, %{{.*}} : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32>
// CHECK: torch.aten.expand %[[GVAR]]
// CHECK: return %{{.*}}, %{{.*}} : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3],f32>

func.func @train_mode_batch_norm_gradient_flows_through_the_batch_statistics(%w: !torch.vtensor<[2,3,4,4],f32>, %gamma: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3],f32>) {
  %x = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
  %weight = "pock.param"(%gamma) {param_name = "bn.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %int-1 = torch.constant.int -1
  %true = torch.constant.bool true
  %false = torch.constant.bool false
  %eps = torch.constant.float 1.000000e-05
  %bdims = torch.prim.ListConstruct %int0, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %var, %mean = torch.aten.var_mean.correction %x, %bdims, %int0, %true : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.int, !torch.bool -> !torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1,3,1,1],f32>
  %ve = torch.aten.add.Scalar %var, %eps, %int1 : !torch.vtensor<[1,3,1,1],f32>, !torch.float, !torch.int -> !torch.vtensor<[1,3,1,1],f32>
  %r = torch.aten.rsqrt %ve : !torch.vtensor<[1,3,1,1],f32> -> !torch.vtensor<[1,3,1,1],f32>
  %c = torch.aten.sub.Tensor %x, %mean, %int1 : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[1,3,1,1],f32>, !torch.int -> !torch.vtensor<[2,3,4,4],f32>
  %n = torch.aten.mul.Tensor %c, %r : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[1,3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %w1 = torch.aten.unsqueeze %weight, %int-1 : !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3,1],f32>
  %w2 = torch.aten.unsqueeze %w1, %int-1 : !torch.vtensor<[3,1],f32>, !torch.int -> !torch.vtensor<[3,1,1],f32>
  %y = torch.aten.mul.Tensor %n, %w2 : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %sq = torch.aten.mul.Tensor %y, %y : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %dims = torch.prim.ListConstruct : () -> !torch.list<int>
  %l = torch.aten.sum.dim_IntList %sq, %dims, %false, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[],f32>
  %gx = "pock.grad"(%l, %x) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,3,4,4],f32>) -> !torch.vtensor<[2,3,4,4],f32>
  %gw = "pock.grad"(%l, %weight) : (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %gx, %gw : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3],f32>
}
