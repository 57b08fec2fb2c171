// RUN: pock-opt --split-input-file %s -p pock-order-param-reads | filecheck %s
// RUN: pock-opt --split-input-file %s -p pock-order-param-reads,pock-reorder-updates | filecheck %s --check-prefix=REORDERED

// Two linear layers, backward written out (%y stands in for the output's cotangent). Each weight
// is read through a transpose by the input gradient below it: the update of w2 then reads
// w2 + 0 * gh[0] (gh feeds layer 1's weight-gradient matmul, so IREE holds it in a buffer), the
// update of w1 reads w1 + 0 * gx[0] (gx is returned).
// CHECK-LABEL: func.func @two_layers
// CHECK:      %[[P1:.*]] = "pock.param"(%arg0)
// CHECK:      %[[P2:.*]] = "pock.param"(%arg1)
// CHECK:      %[[P2T:.*]] = torch.aten.transpose.int %[[P2]]
// CHECK-NEXT: %[[GH:.*]] = torch.aten.mm %{{.*}}, %[[P2T]]
// CHECK:      %[[P1T:.*]] = torch.aten.transpose.int %[[P1]]
// CHECK-NEXT: %[[GX:.*]] = torch.aten.mm %[[GH]], %[[P1T]]
// CHECK:      %[[FLAT_GX:.*]] = torch.aten.view %[[GX]]
// CHECK:      %[[FIRST_GX:.*]] = torch.aten.select.int %[[FLAT_GX]], %{{.*}}, %{{.*}} : !torch.vtensor<[8],f32>, !torch.int, !torch.int -> !torch.vtensor<[],f32>
// CHECK:      %[[ZERO_GX:.*]] = torch.aten.mul.Scalar %[[FIRST_GX]], %{{.*}} : !torch.vtensor<[],f32>, !torch.float
// CHECK:      %[[ORDERED_P1:.*]] = torch.aten.add.Tensor %[[P1]], %[[ZERO_GX]]
// CHECK-NEXT: %[[N1:.*]] = "pock.sgd"(%[[ORDERED_P1]],
// CHECK:      %[[FLAT_GH:.*]] = torch.aten.view %[[GH]]
// CHECK:      %[[FIRST_GH:.*]] = torch.aten.select.int %[[FLAT_GH]]
// CHECK:      %[[ZERO_GH:.*]] = torch.aten.mul.Scalar %[[FIRST_GH]]
// CHECK:      %[[ORDERED_P2:.*]] = torch.aten.add.Tensor %[[P2]], %[[ZERO_GH]]
// CHECK-NEXT: %[[N2:.*]] = "pock.sgd"(%[[ORDERED_P2]],
// CHECK:      return %{{.*}}, %[[N1]], %[[N2]], %[[GX]]

// pock-reorder-updates then keeps w2's update after gh, its new last need, where it would
// otherwise move right after gw2.
// REORDERED-LABEL: func.func @two_layers
// REORDERED:      %[[P2:.*]] = "pock.param"(%arg1)
// REORDERED:      %[[P2T:.*]] = torch.aten.transpose.int %[[P2]]
// REORDERED-NEXT: %[[GH:.*]] = torch.aten.mm %{{.*}}, %[[P2T]]
// REORDERED:      %[[GW2:.*]] = torch.aten.mm %{{.*}}, %{{.*}} : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
// REORDERED:      %[[FLAT_GH:.*]] = torch.aten.view %[[GH]]
// REORDERED:      "pock.sgd"(%{{.*}}, %[[GW2]])
// REORDERED-NEXT: return
func.func @two_layers(%w1: !torch.vtensor<[4,4],f32>, %w2: !torch.vtensor<[4,4],f32>, %x: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>) {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %p1 = "pock.param"(%w1) {param_name = "l1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %p2 = "pock.param"(%w2) {param_name = "l2.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %h = torch.aten.mm %x, %p1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %y = torch.aten.mm %h, %p2 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %ht = torch.aten.transpose.int %h, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw2 = torch.aten.mm %ht, %y : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %p2t = torch.aten.transpose.int %p2, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gh = torch.aten.mm %y, %p2t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %xt = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw1 = torch.aten.mm %xt, %gh : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %p1t = torch.aten.transpose.int %p1, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gx = torch.aten.mm %gh, %p1t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %n1 = "pock.sgd"(%p1, %gw1) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %n2 = "pock.sgd"(%p2, %gw2) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  return %loss, %n1, %n2, %gx : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>
}

// -----

// Read by the forward and by its update only (the last layer of a net, or one whose input needs
// no gradient): nothing to order, the update reads the parameter itself.
// CHECK-LABEL: func.func @forward_reads_only
// CHECK:      %[[P:.*]] = "pock.param"(%arg0)
// CHECK-NOT:  torch.aten.select.int
// CHECK:      "pock.sgd"(%[[P]],
func.func @forward_reads_only(%w: !torch.vtensor<[4,4],f32>, %x: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>) {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %p = "pock.param"(%w) {param_name = "l.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %y = torch.aten.mm %x, %p : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %xt = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw = torch.aten.mm %xt, %y : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %n = "pock.sgd"(%p, %gw) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  return %loss, %n : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>
}

// -----

// A scale (a norm's weight) whose input gradient feeds no contraction, only the gradient of the
// parameter below it (an embedding's): the update waits for that gradient.
// CHECK-LABEL: func.func @no_contraction_below
// CHECK:      %[[SCALE:.*]] = "pock.param"(%arg1)
// CHECK:      torch.aten.sum %
// CHECK:      %[[GH:.*]] = torch.aten.mul.Tensor %{{.*}}, %[[SCALE]]
// CHECK-NEXT: %[[XGH:.*]] = torch.aten.mul.Tensor %arg2, %[[GH]]
// CHECK-NEXT: %[[GEMB:.*]] = torch.aten.sum.dim_IntList %[[XGH]],
// CHECK-NEXT: "pock.sgd"(%{{.*}}, %[[GEMB]])
// CHECK:      %[[FIRST:.*]] = torch.aten.select.int %[[GEMB]]
// CHECK:      %[[ZERO:.*]] = torch.aten.mul.Scalar %[[FIRST]]
// CHECK:      %[[ORDERED:.*]] = torch.aten.add.Tensor %[[SCALE]], %[[ZERO]]
// CHECK-NEXT: "pock.sgd"(%[[ORDERED]],
func.func @no_contraction_below(%e: !torch.vtensor<[4],f32>, %s: !torch.vtensor<[4],f32>, %x: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) {
  %none = torch.constant.none
  %false = torch.constant.bool false
  %int0 = torch.constant.int 0
  %pe = "pock.param"(%e) {param_name = "embedding", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %ps = "pock.param"(%s) {param_name = "norm.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %h = torch.aten.mul.Tensor %x, %pe : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[2,4],f32>
  %y = torch.aten.mul.Tensor %h, %ps : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[2,4],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %dims = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %hy = torch.aten.mul.Tensor %h, %y : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
  %gs = torch.aten.sum.dim_IntList %hy, %dims, %false, %none : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[4],f32>
  %gh = torch.aten.mul.Tensor %y, %ps : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4],f32> -> !torch.vtensor<[2,4],f32>
  %xgh = torch.aten.mul.Tensor %x, %gh : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
  %ge = torch.aten.sum.dim_IntList %xgh, %dims, %false, %none : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[4],f32>
  %ne = "pock.sgd"(%pe, %ge) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  %ns = "pock.sgd"(%ps, %gs) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32>
  return %loss, %ne, %ns : !torch.vtensor<[],f32>, !torch.vtensor<[4],f32>, !torch.vtensor<[4],f32>
}
