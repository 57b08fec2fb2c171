// RUN: not pock-opt --split-input-file %s 2>&1 | filecheck %s
// RUN: not pock-opt %s 2>&1 | filecheck --check-prefix=WHOLE %s

// Each '// -----' chunk is its own module: a failing chunk is reported at its line in the
// file (not in the chunk) while the other chunks, which may reuse each other's names, are
// still printed, separated by '// -----'; the exit code says that one failed. Without the
// flag the file is one module, and its first error leaves nothing to print.

// CHECK: split-input-file.mlir:26:8: error: 'pock.sgd' op SGD lr must be > 0, got -1.0
// CHECK: func.func @defined_in_two_chunks(%{{.*}}: !torch.vtensor<[3],f32>)
// CHECK-NEXT: return
// CHECK: // -----
// CHECK: func.func @defined_in_two_chunks(%{{.*}}: !torch.vtensor<[2],f32>)
// CHECK-NOT: @invalid_in_the_middle

// WHOLE: split-input-file.mlir:26:8: error: 'pock.sgd' op SGD lr must be > 0, got -1.0
// WHOLE-NOT: func.func

func.func @defined_in_two_chunks(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  return %x : !torch.vtensor<[3],f32>
}

// -----

func.func @invalid_in_the_middle(%w: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  %n = "pock.sgd"(%w, %w) {lr = -1.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return %n : !torch.vtensor<[3],f32>
}

// -----

func.func @defined_in_two_chunks(%x: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
  return %x : !torch.vtensor<[2],f32>
}
