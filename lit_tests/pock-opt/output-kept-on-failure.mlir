// RUN: echo "what the file held" > %t.out
// RUN: not pock-opt %s -o %t.out
// RUN: filecheck %s --input-file=%t.out --check-prefix=KEPT
// RUN: ln -sf %t.out %t.link
// RUN: pock-opt %S/../dialect/ops.mlir -o %t.link
// RUN: filecheck %s --input-file=%t.out --check-prefix=KEPT
// RUN: filecheck %s --input-file=%t.link --check-prefix=WRITTEN

// -o FILE is written only when the run succeeds, atomically: a failing run leaves FILE as it
// was, and a symlink at FILE is replaced by the output, not written through.
// KEPT: what the file held
// WRITTEN: func.func
func.func @broken(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  return %undefined : !torch.vtensor<[3],f32>
}
