// RUN: pock-opt -p 'pock-expand-custom{chunk=64}' %s | filecheck %s
// RUN: pock-opt -p pock-autodiff %s | filecheck --check-prefix=AUTODIFF %s

// x @ W^T for an int4 W of 8 outputs and 16 inputs (two groups of 8): chunks of 64 values are 4 rows,
// each unpacked from its bytes (low nibble first, less 8, times its group's scale) into a matmul.
// CHECK-LABEL: func.func @int4_linear_by_rows(
// CHECK-SAME: %[[X:.*]]: !torch.vtensor<[2,3,16],f32>, %[[P:.*]]: !torch.vtensor<[8,8],ui8>, %[[S:.*]]: !torch.vtensor<[8,2],f32>)
// CHECK: %[[X2:.*]] = torch.aten.view %[[X]], {{.*}} -> !torch.vtensor<[6,16],f32>
// CHECK: %[[P0:.*]] = torch.aten.slice.Tensor %[[P]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : {{.*}} -> !torch.vtensor<[4,8],ui8>
// CHECK: %[[S0:.*]] = torch.aten.slice.Tensor %[[S]], {{.*}} -> !torch.vtensor<[4,2],f32>
// CHECK: %[[B0:.*]] = torch.prims.convert_element_type %[[P0]], {{.*}} -> !torch.vtensor<[4,8],f32>
// CHECK: %[[HIGH:.*]] = torch.aten.floor
// CHECK: %[[LOW:.*]] = torch.aten.sub.Tensor %[[B0]]
// CHECK: torch.prim.ListConstruct %[[LOW]], %[[HIGH]]
// CHECK: torch.aten.stack {{.*}} -> !torch.vtensor<[4,8,2],f32>
// CHECK: torch.aten.sub.Scalar
// CHECK: %[[W0:.*]] = torch.aten.view {{.*}} -> !torch.vtensor<[4,16],f32>
// CHECK: %[[W0T:.*]] = torch.aten.transpose.int %[[W0]]
// CHECK: %[[Y0:.*]] = torch.aten.mm %[[X2]], %[[W0T]] : {{.*}} -> !torch.vtensor<[6,4],f32>
// CHECK: %[[Y1:.*]] = torch.aten.mm %[[X2]], %{{.*}} : {{.*}} -> !torch.vtensor<[6,4],f32>
// CHECK: %[[PARTS:.*]] = torch.prim.ListConstruct %[[Y0]], %[[Y1]]
// CHECK: %[[Y:.*]] = torch.aten.cat %[[PARTS]], {{.*}} -> !torch.vtensor<[6,8],f32>
// CHECK: %[[OUT:.*]] = torch.aten.view %[[Y]], {{.*}} -> !torch.vtensor<[2,3,8],f32>
// CHECK-NOT: torch.operator
// CHECK: return %[[OUT]]
func.func @int4_linear_by_rows(%x: !torch.vtensor<[2,3,16],f32>, %packed: !torch.vtensor<[8,8],ui8>, %scale: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[2,3,8],f32> {
  %group = torch.constant.int 8
  %y = torch.operator "torch.pock.int4_linear"(%x, %packed, %scale, %group) : (!torch.vtensor<[2,3,16],f32>, !torch.vtensor<[8,8],ui8>, !torch.vtensor<[8,2],f32>, !torch.int) -> !torch.vtensor<[2,3,8],f32>
  return %y : !torch.vtensor<[2,3,8],f32>
}

// g @ W, the input gradient: by columns, whole groups (8 columns: 64 values of the 8 rows) a chunk.
// CHECK-LABEL: func.func @int4_matmul_by_columns(
// CHECK-SAME: %[[G:.*]]: !torch.vtensor<[6,8],f32>, %[[P:.*]]: !torch.vtensor<[8,8],ui8>, %[[S:.*]]: !torch.vtensor<[8,2],f32>)
// CHECK: torch.aten.slice.Tensor %[[P]], {{.*}} -> !torch.vtensor<[8,4],ui8>
// CHECK: torch.aten.slice.Tensor %[[S]], {{.*}} -> !torch.vtensor<[8,1],f32>
// CHECK: %[[W0:.*]] = torch.aten.view {{.*}} -> !torch.vtensor<[8,8],f32>
// CHECK: %[[D0:.*]] = torch.aten.mm %{{.*}}, %[[W0]] : {{.*}} -> !torch.vtensor<[6,8],f32>
// CHECK: %[[D1:.*]] = torch.aten.mm {{.*}} -> !torch.vtensor<[6,8],f32>
// CHECK: torch.prim.ListConstruct %[[D0]], %[[D1]]
// CHECK: torch.aten.cat {{.*}} -> !torch.vtensor<[6,16],f32>
// CHECK-NOT: torch.operator
func.func @int4_matmul_by_columns(%g: !torch.vtensor<[6,8],f32>, %packed: !torch.vtensor<[8,8],ui8>, %scale: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[6,16],f32> {
  %group = torch.constant.int 8
  %dx = torch.operator "torch.pock.int4_matmul"(%g, %packed, %scale, %group) : (!torch.vtensor<[6,8],f32>, !torch.vtensor<[8,8],ui8>, !torch.vtensor<[8,2],f32>, !torch.int) -> !torch.vtensor<[6,16],f32>
  return %dx : !torch.vtensor<[6,16],f32>
}

// A weight within one chunk is still unpacked in two halves, the forward's by rows, so that it
// never shares an unpacked chunk with the backward's.
// CHECK-LABEL: func.func @one_chunk_is_split_in_two(
// CHECK-COUNT-2: torch.aten.mm {{.*}} -> !torch.vtensor<[6,4],f32>
func.func @one_chunk_is_split_in_two(%x: !torch.vtensor<[6,16],f32>, %packed: !torch.vtensor<[8,8],ui8>, %scale: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[6,8],f32> {
  %group = torch.constant.int 8
  %y = torch.operator "torch.pock.int4_linear"(%x, %packed, %scale, %group) : (!torch.vtensor<[6,16],f32>, !torch.vtensor<[8,8],ui8>, !torch.vtensor<[8,2],f32>, !torch.int) -> !torch.vtensor<[6,8],f32>
  return %y : !torch.vtensor<[6,8],f32>
}

// pock-autodiff gives the int4 linear's input the gradient g @ W as pock.int4_matmul; the frozen
// bytes and scales get none.
// AUTODIFF-LABEL: func.func @input_gradient(
// AUTODIFF-SAME: %[[X:.*]]: !torch.vtensor<[6,16],f32>, %[[P:.*]]: !torch.vtensor<[8,8],ui8>, %[[S:.*]]: !torch.vtensor<[8,2],f32>)
// AUTODIFF: %[[PX:.*]] = "pock.param"(%[[X]])
// AUTODIFF: %[[Y:.*]] = torch.operator "torch.pock.int4_linear"(%[[PX]], %[[P]], %[[S]], %{{.*}})
// AUTODIFF: %[[G:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[6,8],f32>
// AUTODIFF: %[[DX:.*]] = torch.operator "torch.pock.int4_matmul"(%[[G]], %[[P]], %[[S]], %{{.*}}) : {{.*}} -> !torch.vtensor<[6,16],f32>
// AUTODIFF: return %[[DX]]
func.func @input_gradient(%x: !torch.vtensor<[6,16],f32>, %packed: !torch.vtensor<[8,8],ui8>, %scale: !torch.vtensor<[8,2],f32>) -> !torch.vtensor<[6,16],f32> {
  %px = "pock.param"(%x) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[6,16],f32>) -> !torch.vtensor<[6,16],f32>
  %group = torch.constant.int 8
  %y = torch.operator "torch.pock.int4_linear"(%px, %packed, %scale, %group) : (!torch.vtensor<[6,16],f32>, !torch.vtensor<[8,8],ui8>, !torch.vtensor<[8,2],f32>, !torch.int) -> !torch.vtensor<[6,8],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[6,8],f32>, !torch.none -> !torch.vtensor<[],f32>
  %dx = "pock.grad"(%loss, %px) : (!torch.vtensor<[],f32>, !torch.vtensor<[6,16],f32>) -> !torch.vtensor<[6,16],f32>
  return %dx : !torch.vtensor<[6,16],f32>
}
