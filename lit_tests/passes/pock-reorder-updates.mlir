// RUN: pock-opt %s -p pock-reorder-updates | filecheck %s
// RUN: pock-opt %s -p pock-reorder-updates{roots=optimizer},pock-lower-optimizers | filecheck %s --check-prefix=LOWERED
// RUN: pock-opt %s -p pock-lower-optimizers,pock-reorder-updates{roots=returned} | filecheck %s --check-prefix=RETURNED
// RUN: pock-opt %s -p pock-reorder-updates,pock-lower-optimizers,pock-reorder-updates{roots=returned} | filecheck %s --check-prefix=GUARDED
// RUN: not pock-opt %s -p pock-reorder-updates{roots=everything} 2>&1 | filecheck %s --check-prefix=BAD

// Two linear layers, backward written out (%y stands in for the output's cotangent, %gx is the
// input gradient a layer below would need), updates at the end as the training builder emits them.
// Layer 2's update needs only %y and %h: it moves right after %y, before layer 1's backward;
// layer 1's update moves right after %gh, the last op its gradient needs that stays in place.

// CHECK-LABEL: func.func @two_layers
// CHECK:      %[[P1:.*]] = "pock.param"(%arg0)
// CHECK:      %[[P2:.*]] = "pock.param"(%arg1)
// CHECK:      %[[H:.*]] = torch.aten.mm %arg2, %[[P1]]
// CHECK:      %[[Y:.*]] = torch.aten.mm %[[H]], %[[P2]]
// CHECK:      %[[HT:.*]] = torch.aten.transpose.int %[[H]]
// CHECK-NEXT: %[[GW2:.*]] = torch.aten.mm %[[HT]], %[[Y]]
// CHECK-NEXT: %[[N2:.*]] = "pock.sgd"(%[[P2]], %[[GW2]])
// CHECK:      %[[GH:.*]] = torch.aten.mm %[[Y]]
// CHECK:      %[[XT:.*]] = torch.aten.transpose.int %arg2
// CHECK-NEXT: %[[GW1:.*]] = torch.aten.mm %[[XT]], %[[GH]]
// CHECK-NEXT: %[[N1:.*]] = "pock.sgd"(%[[P1]], %[[GW1]])
// CHECK:      %[[GX:.*]] = torch.aten.mm %[[GH]]
// CHECK-NEXT: return %[[N1]], %[[N2]], %[[GX]]

// The lowered arithmetic lands where the moved pock.sgd was.
// LOWERED-LABEL: func.func @two_layers
// LOWERED:      %[[P1:.*]] = "pock.param"(%arg0)
// LOWERED:      %[[P2:.*]] = "pock.param"(%arg1)
// LOWERED:      %[[H:.*]] = torch.aten.mm %arg2
// LOWERED:      %[[Y:.*]] = torch.aten.mm %[[H]]
// LOWERED:      %[[GW2:.*]] = torch.aten.mm %{{.*}}, %[[Y]]
// LOWERED:      torch.aten.mul.Scalar %[[GW2]]
// LOWERED:      torch.aten.sub.Tensor %[[P2]]
// LOWERED:      %[[GH:.*]] = torch.aten.mm %[[Y]]

// After lowering, roots=returned moves the arithmetic that only feeds the results.
// RETURNED-LABEL: func.func @two_layers
// RETURNED:      %[[P1:.*]] = "pock.param"(%arg0)
// RETURNED:      %[[P2:.*]] = "pock.param"(%arg1)
// RETURNED:      %[[H:.*]] = torch.aten.mm %arg2
// RETURNED:      %[[Y:.*]] = torch.aten.mm %[[H]]
// RETURNED:      %[[GW2:.*]] = torch.aten.mm %{{.*}}, %[[Y]]
// RETURNED:      torch.aten.mul.Scalar %[[GW2]]
// RETURNED:      torch.aten.sub.Tensor %[[P2]]
// RETURNED:      %[[GH:.*]] = torch.aten.mm %[[Y]]
// RETURNED:      %[[GW1:.*]] = torch.aten.mm %{{.*}}, %[[GH]]
// RETURNED:      torch.aten.mul.Scalar %[[GW1]]
// RETURNED:      torch.aten.sub.Tensor %[[P1]]
// RETURNED-NEXT: return

// BAD: error: pock-reorder-updates: roots must be one of optimizer, returned, got 'everything'

func.func @two_layers(%w1: !torch.vtensor<[4,4],f32>, %w2: !torch.vtensor<[4,4],f32>, %x: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>) {
  %p1 = "pock.param"(%w1) {param_name = "l1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %p2 = "pock.param"(%w2) {param_name = "l2.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %h = torch.aten.mm %x, %p1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %y = torch.aten.mm %h, %p2 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %p2t = torch.aten.transpose.int %p2, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gh = torch.aten.mm %y, %p2t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %ht = torch.aten.transpose.int %h, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw2 = torch.aten.mm %ht, %y : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %xt = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw1 = torch.aten.mm %xt, %gh : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %p1t = torch.aten.transpose.int %p1, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gx = torch.aten.mm %gh, %p1t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %n1 = "pock.sgd"(%p1, %gw1) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %n2 = "pock.sgd"(%p2, %gw2) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  return %n1, %n2, %gx : !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>
}

// A group that needs another group: the channel-sparse write-back needs the update's rows, and
// (after pock-order-param-reads) the input gradient %gx, which stays in place (the backward below
// reads it). The update's group moves up to just after %y; the write-back goes after %gx, not
// after where the update's group went (the write-back's own ops come after the update in the input,
// as pock-order-param-reads inserts them).
// CHECK-LABEL: func.func @write_back_after_its_needs
// CHECK:      %[[Y:.*]] = torch.aten.mm %arg1,
// CHECK:      %[[ROWS:.*]] = "pock.channel_slice"
// CHECK-NEXT: %[[NEW:.*]] = "pock.sgd"(%[[ROWS]],
// CHECK:      %[[GX:.*]] = torch.aten.mm %[[Y]],
// CHECK:      torch.aten.view %[[GX]]
// CHECK:      %[[WRITTEN:.*]] = "pock.channel_update"(%{{.*}}, %[[NEW]])
// CHECK:      return %{{.*}}, %[[WRITTEN]],
func.func @write_back_after_its_needs(%w: !torch.vtensor<[4,4],f32>, %x: !torch.vtensor<[2,4],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[],f32>) {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %int2 = torch.constant.int 2
  %p = "pock.param"(%w) {param_name = "l.weight", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %y = torch.aten.mm %x, %p : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %xt = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %g = torch.aten.mm %xt, %y : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %g_rows = torch.aten.slice.Tensor %g, %int0, %int0, %int2, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int, !torch.int, !torch.int -> !torch.vtensor<[2,4],f32>
  %pt = torch.aten.transpose.int %p, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gx = torch.aten.mm %y, %pt : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %rows = "pock.channel_slice"(%p) {channels = 2 : i64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[2,4],f32>
  %new = "pock.sgd"(%rows, %g_rows) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %int-1 = torch.constant.int -1
  %float0 = torch.constant.float 0.0
  %shape = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %flat = torch.aten.view %gx, %shape : !torch.vtensor<[2,4],f32>, !torch.list<int> -> !torch.vtensor<[8],f32>
  %first = torch.aten.select.int %flat, %int0, %int0 : !torch.vtensor<[8],f32>, !torch.int, !torch.int -> !torch.vtensor<[],f32>
  %zero = torch.aten.mul.Scalar %first, %float0 : !torch.vtensor<[],f32>, !torch.float -> !torch.vtensor<[],f32>
  %ordered = torch.aten.add.Tensor %p, %zero, %int1 : !torch.vtensor<[4,4],f32>, !torch.vtensor<[],f32>, !torch.int -> !torch.vtensor<[4,4],f32>
  %written = "pock.channel_update"(%ordered, %new) : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[4,4],f32>
  %gx_sum = torch.aten.sum %gx, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  return %loss, %written, %gx_sum : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[],f32>
}

// The training builder's step: each new value is selected against the old one by whether the loss
// is finite, in selects at the return. The lowered pipeline moves the updates (roots=optimizer),
// lowers them, then moves each select to its update (roots=returned): a select left at the return
// would keep every gradient alive to the end of the step, since IREE fuses the update into it.
// Layer 2's AdamW moments are each read by their select and by the parameter's update: the selects
// go after the update, as IREE fuses a value read twice into its last reader only.
// (%dy stands in for the output's cotangent, which the backward computes after the loss; %gx, the
// input gradient, is a root too, anchored where layer 1's update is, and goes first by input order.)
// GUARDED-LABEL: func.func @guarded_updates
// GUARDED:      %[[LOSS:.*]] = torch.aten.sum
// GUARDED:      %[[FINITE:.*]] = torch.aten.logical_and
// GUARDED:      %[[DY:.*]] = torch.aten.mul.Tensor
// GUARDED:      torch.aten.mm %{{.*}}, %[[DY]] :
// GUARDED:      torch.aten.sqrt
// GUARDED:      %[[N2:.*]] = torch.aten.sub.Tensor
// GUARDED-NEXT: %[[S2:.*]] = torch.aten.where.self %[[FINITE]], %[[N2]], %arg1
// GUARDED-NEXT: %[[SM2:.*]] = torch.aten.where.self %[[FINITE]], %{{.*}}, %arg3
// GUARDED-NEXT: %[[SV2:.*]] = torch.aten.where.self %[[FINITE]], %{{.*}}, %arg4
// GUARDED:      %[[GH:.*]] = torch.aten.mm %[[DY]], %{{.*}} :
// GUARDED:      %[[GW1:.*]] = torch.aten.mm %{{.*}}, %[[GH]]
// GUARDED:      %[[N1:.*]] = torch.aten.sub.Tensor
// GUARDED:      %[[GX:.*]] = torch.aten.mm %[[GH]]
// GUARDED-NEXT: %[[S1:.*]] = torch.aten.where.self %[[FINITE]], %[[N1]], %arg0
// GUARDED-NEXT: return %[[LOSS]], %[[S1]], %[[S2]], %[[SM2]], %[[SV2]], %[[GX]]
func.func @guarded_updates(%w1: !torch.vtensor<[4,4],f32>, %w2: !torch.vtensor<[4,4],f32>, %x: !torch.vtensor<[2,4],f32>, %m2: !torch.vtensor<[4,4],f32>, %v2: !torch.vtensor<[4,4],f32>, %step: !torch.vtensor<[],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>) {
  %none = torch.constant.none
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %max = torch.constant.float 3.4028234663852886E+38
  %min = torch.constant.float -3.4028234663852886E+38
  %p1 = "pock.param"(%w1) {param_name = "l1.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %p2 = "pock.param"(%w2) {param_name = "l2.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %h = torch.aten.mm %x, %p1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %y = torch.aten.mm %h, %p2 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %le = torch.aten.le.Scalar %loss, %max : !torch.vtensor<[],f32>, !torch.float -> !torch.vtensor<[],i1>
  %ge = torch.aten.ge.Scalar %loss, %min : !torch.vtensor<[],f32>, !torch.float -> !torch.vtensor<[],i1>
  %finite = torch.aten.logical_and %le, %ge : !torch.vtensor<[],i1>, !torch.vtensor<[],i1> -> !torch.vtensor<[],i1>
  %dy = torch.aten.mul.Tensor %y, %loss : !torch.vtensor<[2,4],f32>, !torch.vtensor<[],f32> -> !torch.vtensor<[2,4],f32>
  %p2t = torch.aten.transpose.int %p2, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gh = torch.aten.mm %dy, %p2t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %ht = torch.aten.transpose.int %h, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw2 = torch.aten.mm %ht, %dy : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %xt = torch.aten.transpose.int %x, %int0, %int1 : !torch.vtensor<[2,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,2],f32>
  %gw1 = torch.aten.mm %xt, %gh : !torch.vtensor<[4,2],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[4,4],f32>
  %n1 = "pock.sgd"(%p1, %gw1) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>) -> !torch.vtensor<[4,4],f32>
  %n2:3 = "pock.adamw"(%p2, %gw2, %m2, %v2, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>)
  %p1t = torch.aten.transpose.int %p1, %int0, %int1 : !torch.vtensor<[4,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,4],f32>
  %gx = torch.aten.mm %gh, %p1t : !torch.vtensor<[2,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[2,4],f32>
  %s1 = torch.aten.where.self %finite, %n1, %w1 : !torch.vtensor<[],i1>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %s2 = torch.aten.where.self %finite, %n2#0, %w2 : !torch.vtensor<[],i1>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %sm2 = torch.aten.where.self %finite, %n2#1, %m2 : !torch.vtensor<[],i1>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  %sv2 = torch.aten.where.self %finite, %n2#2, %v2 : !torch.vtensor<[],i1>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32> -> !torch.vtensor<[4,4],f32>
  return %loss, %s1, %s2, %sm2, %sv2, %gx : !torch.vtensor<[],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[4,4],f32>, !torch.vtensor<[2,4],f32>
}
