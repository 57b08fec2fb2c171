// RUN: not pock-opt -p pock-autodif %s 2>&1 | filecheck %s
// RUN: not pock-opt -p 'func.func(pock-dce)' %s 2>&1 | filecheck --check-prefix=NESTED %s
// RUN: not pock-opt -p 'pock-dce(cse)' %s 2>&1 | filecheck --check-prefix=POCK-NESTING %s
// RUN: not pock-opt -p 'pock-dce,func.func(cse' %s 2>&1 | filecheck --check-prefix=UNBALANCED %s

// A pipeline is checked before the input is read: an unknown pass is named with the closest
// pock pass and the list of pock passes; pock passes, which run on the whole module, cannot
// be nested. None of it prints a traceback.

// CHECK-NOT: Traceback
// CHECK: pock-opt: error: unknown pass or bad options in 'pock-autodif' ({{.*}}'pock-autodif' does not refer to a registered pass or pass pipeline).
// CHECK-NEXT: Did you mean 'pock-autodiff'? pock passes: pock-apply-sparse-config, pock-autodiff, {{.*}}pock-strip-params; any upstream MLIR pass is accepted too
// CHECK-NOT: Traceback

// NESTED: pock-opt: error: pock passes run on the whole module, so 'pock-dce' cannot be nested in 'func.func(pock-dce)'; list it at the top level of the pipeline

// POCK-NESTING: pock-opt: error: pock pass 'pock-dce' runs on the whole module and takes no nested pipeline: 'pock-dce(cse)'

// UNBALANCED: pock-opt: error: unbalanced brackets in pipeline 'pock-dce,func.func(cse'

func.func @never_read() {
  return
}
