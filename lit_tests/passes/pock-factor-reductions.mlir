// RUN: pock-opt -p pock-factor-reductions,pock-dce %s | filecheck %s

// A per-channel factor (size 1 on every summed dim) leaves the sum: the sum runs over dy alone.
// CHECK-LABEL: func.func @channel_factor_leaves_the_sum(
// CHECK-SAME: %[[DY:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[W:.*]]: !torch.vtensor<[1,3,1,1],f32>)
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[DY]], {{.*}} -> !torch.vtensor<[1,3,1,1],f32>
// CHECK-NEXT: %[[SCALED:.*]] = torch.aten.mul.Tensor %[[SUM]], %[[W]]
// CHECK-NEXT: return %[[SCALED]]
func.func @channel_factor_leaves_the_sum(%dy: !torch.vtensor<[2,3,4,4],f32>, %w: !torch.vtensor<[1,3,1,1],f32>) -> !torch.vtensor<[1,3,1,1],f32> {
  %scaled = torch.aten.mul.Tensor %dy, %w : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[1,3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %dims = torch.prim.ListConstruct %int0, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %true = torch.constant.bool true
  %none = torch.constant.none
  %sum = torch.aten.sum.dim_IntList %scaled, %dims, %true, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3,1,1],f32>
  return %sum : !torch.vtensor<[1,3,1,1],f32>
}

// Batch norm's backward sums dy and -(dy * w) * rstd: one sum of dy, scaled for the second, whose
// factors (a weight of rank 3, a statistic, a number) broadcast to the sum's type.
// CHECK-LABEL: func.func @equal_sums_are_one(
// CHECK-SAME: %[[DY:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[W:.*]]: !torch.vtensor<[3,1,1],f32>, %[[RSTD:.*]]: !torch.vtensor<[1,3,1,1],f32>)
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[DY]]
// CHECK-NOT: torch.aten.sum.dim_IntList
// CHECK: %[[BY_W:.*]] = torch.aten.mul.Tensor %[[SUM]], %[[W]]
// CHECK-NEXT: %[[BY_RSTD:.*]] = torch.aten.mul.Tensor %[[BY_W]], %[[RSTD]]
// CHECK: %[[NEGATED:.*]] = torch.aten.mul.Scalar %[[BY_RSTD]], %{{.*}} : !torch.vtensor<[1,3,1,1],f32>, !torch.int
// CHECK-NEXT: return %[[SUM]], %[[NEGATED]]
func.func @equal_sums_are_one(%dy: !torch.vtensor<[2,3,4,4],f32>, %w: !torch.vtensor<[3,1,1],f32>, %rstd: !torch.vtensor<[1,3,1,1],f32>) -> (!torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1,3,1,1],f32>) {
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %true = torch.constant.bool true
  %none = torch.constant.none
  %dims = torch.prim.ListConstruct %int0, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %db = torch.aten.sum.dim_IntList %dy, %dims, %true, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3,1,1],f32>
  %dxhat = torch.aten.mul.Tensor %dy, %w : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %scaled = torch.aten.mul.Tensor %dxhat, %rstd : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[1,3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %intm1 = torch.constant.int -1
  %negated = torch.aten.mul.Scalar %scaled, %intm1 : !torch.vtensor<[2,3,4,4],f32>, !torch.int -> !torch.vtensor<[2,3,4,4],f32>
  %dims2 = torch.prim.ListConstruct %int0, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %dmean = torch.aten.sum.dim_IntList %negated, %dims2, %true, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3,1,1],f32>
  return %db, %dmean : !torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1,3,1,1],f32>
}

// Both factors vary along the summed dim: the sum stays as it was.
// CHECK-LABEL: func.func @varying_factors_stay(
// CHECK: %[[PRODUCT:.*]] = torch.aten.mul.Tensor
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[PRODUCT]]
// CHECK-NEXT: return %[[SUM]]
func.func @varying_factors_stay(%a: !torch.vtensor<[4,3],f32>, %b: !torch.vtensor<[4,1],f32>) -> !torch.vtensor<[1,3],f32> {
  %product = torch.aten.mul.Tensor %a, %b : !torch.vtensor<[4,3],f32>, !torch.vtensor<[4,1],f32> -> !torch.vtensor<[4,3],f32>
  %int0 = torch.constant.int 0
  %dims = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %true = torch.constant.bool true
  %none = torch.constant.none
  %sum = torch.aten.sum.dim_IntList %product, %dims, %true, %none : !torch.vtensor<[4,3],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3],f32>
  return %sum : !torch.vtensor<[1,3],f32>
}

// Without keepdim the factor's shape would need the summed dims dropped: left as it was.
// CHECK-LABEL: func.func @without_keepdim_stays(
// CHECK: %[[PRODUCT:.*]] = torch.aten.mul.Tensor
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[PRODUCT]]
// CHECK-NEXT: return %[[SUM]]
func.func @without_keepdim_stays(%a: !torch.vtensor<[4,3],f32>, %c: !torch.vtensor<[1,3],f32>) -> !torch.vtensor<[3],f32> {
  %product = torch.aten.mul.Tensor %a, %c : !torch.vtensor<[4,3],f32>, !torch.vtensor<[1,3],f32> -> !torch.vtensor<[4,3],f32>
  %int0 = torch.constant.int 0
  %dims = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>
  %false = torch.constant.bool false
  %none = torch.constant.none
  %sum = torch.aten.sum.dim_IntList %product, %dims, %false, %none : !torch.vtensor<[4,3],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[3],f32>
  return %sum : !torch.vtensor<[3],f32>
}

// A product a sum already reads is built on: sum(x * g * m) after sum(g * m) multiplies g * m by x,
// so m has the one user (a batch norm's dy = g * mask: IREE fuses the ReLU6 mask into it).
// CHECK-LABEL: func.func @a_summed_product_is_built_on(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[G:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[M:.*]]: !torch.vtensor<[2,3,4,4],f32>, %[[RSTD:.*]]: !torch.vtensor<[1,3,1,1],f32>)
// CHECK: %[[DY:.*]] = torch.aten.mul.Tensor %[[G]], %[[M]]
// CHECK: %[[DB:.*]] = torch.aten.sum.dim_IntList %[[DY]]
// CHECK-NOT: torch.aten.mul.Tensor %[[X]], %[[G]]
// CHECK: %[[DYX:.*]] = torch.aten.mul.Tensor %[[DY]], %[[X]]
// CHECK: %[[SUM:.*]] = torch.aten.sum.dim_IntList %[[DYX]]
// CHECK-NEXT: %[[SCALED:.*]] = torch.aten.mul.Tensor %[[SUM]], %[[RSTD]]
// CHECK-NEXT: return %[[DB]], %[[SCALED]]
func.func @a_summed_product_is_built_on(%x: !torch.vtensor<[2,3,4,4],f32>, %g: !torch.vtensor<[2,3,4,4],f32>, %m: !torch.vtensor<[2,3,4,4],f32>, %rstd: !torch.vtensor<[1,3,1,1],f32>) -> (!torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1,3,1,1],f32>) {
  %int0 = torch.constant.int 0
  %int2 = torch.constant.int 2
  %int3 = torch.constant.int 3
  %true = torch.constant.bool true
  %none = torch.constant.none
  %dims = torch.prim.ListConstruct %int0, %int2, %int3 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
  %dy = torch.aten.mul.Tensor %g, %m : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %db = torch.aten.sum.dim_IntList %dy, %dims, %true, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3,1,1],f32>
  %xdy = torch.aten.mul.Tensor %x, %dy : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[2,3,4,4],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %scaled = torch.aten.mul.Tensor %xdy, %rstd : !torch.vtensor<[2,3,4,4],f32>, !torch.vtensor<[1,3,1,1],f32> -> !torch.vtensor<[2,3,4,4],f32>
  %dw = torch.aten.sum.dim_IntList %scaled, %dims, %true, %none : !torch.vtensor<[2,3,4,4],f32>, !torch.list<int>, !torch.bool, !torch.none -> !torch.vtensor<[1,3,1,1],f32>
  return %db, %dw : !torch.vtensor<[1,3,1,1],f32>, !torch.vtensor<[1,3,1,1],f32>
}
