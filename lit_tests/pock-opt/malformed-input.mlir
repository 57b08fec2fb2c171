// RUN: not pock-opt %s 2>&1 | filecheck %s
// RUN: not pock-opt - < %s 2>&1 | filecheck --check-prefix=STDIN %s
// RUN: python -c "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:], capture_output=True).returncode != 1)" pock-opt %s
// RUN: not pock-opt %t.does-not-exist 2>&1 | filecheck --check-prefix=MISSING %s

// Malformed IR is reported as FILE:LINE:COL: error: MESSAGE, with exit code 1 (the python
// line checks the code itself, which `not` does not) and no Python traceback.

// CHECK-NOT: Traceback
// CHECK: malformed-input.mlir:24:10: error: use of undeclared SSA value name
// CHECK-NOT: Traceback

// STDIN: <stdin>:24:10: error: use of undeclared SSA value name

// MISSING-NOT: Traceback
// MISSING: pock-opt: error: {{.*}}No such file or directory{{.*}}does-not-exist
// MISSING-NOT: Traceback

func.func @undeclared_value(%x: !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> {
  return %x : !torch.vtensor<[3],f32>
}

func.func @uses_undeclared_value() -> !torch.vtensor<[3],f32> {
  return %y : !torch.vtensor<[3],f32>
}
