// RUN: not pock-opt -p 'pock-dce{aggressive=true}' %s 2>&1 | filecheck %s
// RUN: not pock-opt -p 'canonicalize{no-such-option=1}' %s 2>&1 | filecheck --check-prefix=UPSTREAM %s
// RUN: not pock-opt -p 'canonicalize{max-iterations=many}' %s 2>&1 | filecheck --check-prefix=UPSTREAM-VALUE %s

// Unknown options and bad option values are reported with the pass they belong to, and
// exit 1 without a traceback.

// CHECK-NOT: Traceback
// CHECK: pock-opt: error: pass 'pock-dce' has no option 'aggressive'; its options: none
// CHECK-NOT: Traceback

// UPSTREAM: pock-opt: error: unknown pass or bad options in 'canonicalize{no-such-option=1}' ({{.*}}no such option no-such-option)

// UPSTREAM-VALUE: 'many' value invalid
// UPSTREAM-VALUE: pock-opt: error: unknown pass or bad options in 'canonicalize{max-iterations=many}'

func.func @never_read() {
  return
}
