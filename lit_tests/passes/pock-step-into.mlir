// RUN: pock-opt --split-input-file --verify-diagnostics -p pock-step-into %s | filecheck %s
// RUN: not pock-opt --split-input-file -p 'pock-step-into{function=evaluate}' %s 2>&1 | filecheck %s --check-prefix=NAMED

// train_step_into takes train_step's arguments, then one mutable tensor per result, the loss
// first; it overwrites each with its result and returns nothing. train_step stays.
// CHECK-LABEL: func.func @train_step(
// CHECK-LABEL: func.func @evaluate(
// CHECK-LABEL: func.func @train_step_into(
// CHECK-SAME: %[[W:.*]]: !torch.vtensor<[3],f32>, %[[M:.*]]: !torch.vtensor<[3],f32>, %[[X:.*]]: !torch.vtensor<[3],f32>,
// CHECK-SAME: %[[LOSS:.*]]: !torch.tensor<[],f32>, %[[NEW_W:.*]]: !torch.tensor<[3],f32>, %[[NEW_M:.*]]: !torch.tensor<[3],f32>) {
// CHECK: %[[R:.*]]:3 = call @train_step(%[[W]], %[[M]], %[[X]])
// CHECK: torch.overwrite.tensor.contents %[[R]]#0 overwrites %[[LOSS]]
// CHECK: torch.overwrite.tensor.contents %[[R]]#1 overwrites %[[NEW_W]]
// CHECK: torch.overwrite.tensor.contents %[[R]]#2 overwrites %[[NEW_M]]
// CHECK-NEXT: return{{$}}
// CHECK-NOT: func.func @evaluate_into

// Any function can be wrapped by name (the second split has no @evaluate: its error comes
// first, on stderr).
// NAMED: error: pock-step-into: no function @evaluate to wrap
// NAMED-NOT: func.func @train_step_into
// NAMED-LABEL: func.func @evaluate_into(
// NAMED-SAME: %[[X:.*]]: !torch.vtensor<[3],f32>, %[[OUT0:.*]]: !torch.tensor<[3],f32>, %[[OUT1:.*]]: !torch.tensor<[3],f32>) {
// NAMED: %[[R:.*]]:2 = call @evaluate(%[[X]])
// NAMED: torch.overwrite.tensor.contents %[[R]]#0 overwrites %[[OUT0]]
// NAMED: torch.overwrite.tensor.contents %[[R]]#1 overwrites %[[OUT1]]
func.func @train_step(%w: !torch.vtensor<[3],f32>, %m: !torch.vtensor<[3],f32>, %x: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  %int1 = torch.constant.int 1
  %none = torch.constant.none
  %y = torch.aten.mul.Tensor %w, %x : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32> -> !torch.vtensor<[3],f32>
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[3],f32>, !torch.none -> !torch.vtensor<[],f32>
  %m2 = torch.aten.add.Tensor %m, %x, %int1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3],f32>
  %w2 = torch.aten.sub.Tensor %w, %m2, %int1 : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.int -> !torch.vtensor<[3],f32>
  return %loss, %w2, %m2 : !torch.vtensor<[],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}
func.func @evaluate(%x: !torch.vtensor<[3],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) {
  return %x, %x : !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>
}

// -----

// A function without results has nothing to write.
// expected-error @+1 {{pock-step-into: @train_step returns nothing to write into buffers}}
func.func @train_step(%x: !torch.vtensor<[],f32>) {
  return
}
