// RUN: python -c "print('module {' * 5000 + '}' * 5000)" > %t.modules.mlir
// RUN: not pock-opt %t.modules.mlir 2>&1 | filecheck %s --check-prefix=MODULES
// RUN: python -c "print('func.func private @f() attributes {a = ' + '[' * 100000 + ']' * 100000 + '}')" > %t.attribute.mlir
// RUN: not pock-opt %t.attribute.mlir 2>&1 | filecheck %s --check-prefix=ATTRIBUTE
// RUN: python -c "print('func.func private @f(' + 'tuple<' * 20000 + 'i32' + '>' * 20000 + ')')" > %t.tuples.mlir
// RUN: not pock-opt %t.tuples.mlir 2>&1 | filecheck %s --check-prefix=TUPLES
// RUN: python -c "import os, sys; sys.stdout.buffer.write(bytes(range(128, 256)) * 32)" > %t.bytes.mlir
// RUN: not pock-opt %t.bytes.mlir 2>&1 | filecheck %s --check-prefix=BYTES
// RUN: not pock-opt %s 2>&1 | filecheck %s --check-prefix=CUSTOM

// Input that would crash the MLIR parser (a stack overflow: a signal, no message) or that is not
// text at all ends in one clear error line and exit code 1.
// MODULES: modules.mlir:1:1: error: brackets nest 5000 deep here, more than pock-opt reads (500)
// ATTRIBUTE: attribute.mlir:1:1: error: brackets nest 100001 deep here
// TUPLES: tuples.mlir:1:1: error: brackets nest 20001 deep here
// BYTES: pock-opt: error: {{.*}}bytes.mlir: not UTF-8 text (byte 0); pock-opt reads MLIR assembly
// BYTES-NOT: Traceback

// A pock op in custom syntax: MLIR rejects it without saying why, pock-opt says what to write.
// CUSTOM: hostile-input.mlir:[[# @LINE + 2]]:1: error: pock ops have no custom syntax; write them in generic form
func.func @custom_syntax(%p: !torch.vtensor<[2],f32>) -> !torch.vtensor<[2],f32> {
  %y = pock.param %p : !torch.vtensor<[2],f32> -> !torch.vtensor<[2],f32>
  return %y : !torch.vtensor<[2],f32>
}
