// RUN: pock-opt -p pock-dce %s | filecheck %s
// RUN: pock-opt -p pock-autodiff,pock-dce %s | filecheck --check-prefix=AUTODIFF %s

// CHECK-LABEL: func.func @unused_chain_is_erased(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[3],f32>)
// CHECK-NEXT: return %[[X]]
func.func @unused_chain_is_erased(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %two = torch.constant.float 2.0
  %doubled = torch.aten.mul.Scalar %x, %two : !torch.vtensor<[3],f32>, !torch.float -> !torch.vtensor<[3],f32>
  %int1 = torch.constant.int 1
  %sum = torch.aten.add.Tensor %doubled, %x, %int1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3],f32>
  return %x : !torch.vtensor<[3],f32>
}

// CHECK-LABEL: func.func @used_ops_are_kept(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[3],f32>)
// CHECK: %[[TWO:.*]] = torch.constant.float 2.000000e+00
// CHECK: %[[DOUBLED:.*]] = torch.aten.mul.Scalar %[[X]], %[[TWO]]
// CHECK-NOT: torch.aten.neg
// CHECK: return %[[DOUBLED]]
func.func @used_ops_are_kept(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %two = torch.constant.float 2.0
  %doubled = torch.aten.mul.Scalar %x, %two : !torch.vtensor<[3],f32>, !torch.float -> !torch.vtensor<[3],f32>
  %unused = torch.aten.neg %doubled : !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  return %doubled : !torch.vtensor<[3],f32>
}

// An unused pock.grad is erased before pock-autodiff would differentiate for it.
// CHECK-LABEL: func.func @unused_pock_ops_are_erased(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[LOSS:.*]]: !torch.vtensor<[],f32>)
// CHECK-NEXT: return %[[W]]
func.func @unused_pock_ops_are_erased(%w: !torch.vtensor<[3],f32>, %loss: !torch.vtensor<[],f32>) -> !torch.vtensor<[3],f32> {
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %w : !torch.vtensor<[3],f32>
}

// An in-place op writes into its operand, so it stays although its result is unused.
// CHECK-LABEL: func.func @in_place_op_is_kept(
// CHECK-SAME: %[[T:.*]]: !torch.tensor<[3],f32>, %[[U:.*]]: !torch.tensor<[3],f32>)
// CHECK: %[[ALPHA:.*]] = torch.constant.int 1
// CHECK: torch.aten.add_.Tensor %[[T]], %[[U]], %[[ALPHA]]
// CHECK: return %[[T]]
func.func @in_place_op_is_kept(%t: !torch.tensor<[3],f32>, %u: !torch.tensor<[3],f32>) -> !torch.tensor<[3],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.aten.add_.Tensor %t, %u, %int1 : !torch.tensor<[3],f32>, !torch.tensor<[3],f32>, !torch.int -> !torch.tensor<[3],f32>
  return %t : !torch.tensor<[3],f32>
}

// A value-semantic op whose name starts and ends with underscores is not in-place.
// CHECK-LABEL: func.func @dunder_op_is_erased(
// CHECK-SAME: %[[A:.*]]: !torch.vtensor<[3],i1>)
// CHECK-NEXT: return %[[A]]
func.func @dunder_op_is_erased(%a: !torch.vtensor<[3],i1>) -> !torch.vtensor<[3],i1> {
  %0 = torch.aten.__and__.Tensor %a, %a : !torch.vtensor<[3],i1>, !torch.vtensor<[3],i1> -> !torch.vtensor<[3],i1>
  return %a : !torch.vtensor<[3],i1>
}

// The region of an unused torch.prim.If may raise, so the op stays.
// CHECK-LABEL: func.func @op_with_region_is_kept
// CHECK: torch.prim.If
// CHECK: torch.prim.RaiseException
func.func @op_with_region_is_kept(%c: !torch.bool, %x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %0 = torch.prim.If %c -> (!torch.vtensor<[3],f32>) {
    %str = torch.constant.str "boom"
    %none = torch.constant.none
    torch.prim.RaiseException %str, %none : !torch.str, !torch.none
    torch.prim.If.yield %x : !torch.vtensor<[3],f32>
  } else {
    torch.prim.If.yield %x : !torch.vtensor<[3],f32>
  }
  return %x : !torch.vtensor<[3],f32>
}

// Ops of other dialects are left to upstream passes: a call may have effects.
// CHECK-LABEL: func.func @call_is_kept(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[3],f32>)
// CHECK: call @op_with_region_is_kept
// CHECK: return %[[X]]
func.func @call_is_kept(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %true = torch.constant.bool true
  %0 = call @op_with_region_is_kept(%true, %x) : (!torch.bool, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %x : !torch.vtensor<[3],f32>
}

// After pock-autodiff, the backward ops for the input's cotangent (mm(seed, transpose(w)))
// and the forward ops that only computed the loss are dead; only transpose(x) @ seed stays.
// CHECK-LABEL: func.func @dead_backward_after_autodiff
// CHECK: "pock.grad"
// AUTODIFF-LABEL: func.func @dead_backward_after_autodiff(
// AUTODIFF-SAME: %[[X:.*]]: !torch.vtensor<[2,3],f32>, %[[W:.*]]: !torch.vtensor<[3,4],f32>)
// AUTODIFF-NOT: pock.param
// AUTODIFF-NOT: torch.aten.sum
// AUTODIFF: %[[SEED:.*]] = torch.aten.expand
// AUTODIFF-NOT: torch.aten.mm
// AUTODIFF: %[[XT:.*]] = torch.aten.transpose.int %[[X]]
// AUTODIFF-NEXT: %[[GW:.*]] = torch.aten.mm %[[XT]], %[[SEED]]
// AUTODIFF-NEXT: return %[[GW]]
func.func @dead_backward_after_autodiff(%x: !torch.vtensor<[2,3],f32>, %w: !torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32> {
  %p = "pock.param"(%w) {param_name = "fc.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32>
  %y = torch.aten.mm %x, %p : !torch.vtensor<[2,3],f32>, !torch.vtensor<[3,4],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[3,4],f32>) -> !torch.vtensor<[3,4],f32>
  return %g : !torch.vtensor<[3,4],f32>
}
