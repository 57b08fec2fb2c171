// RUN: not pock-opt --split-input-file --verify-diagnostics %s 2>&1 | filecheck %s

// --verify-diagnostics matches each error against an `expected-error` annotation on its
// line (or @+N/@-N lines away): the text is a substring of the message, with {{regex}} for
// parts that vary. An annotation without its error, or an error without its annotation,
// fails the run; matched chunks report nothing.

// CHECK-NOT: verify-diagnostics.mlir:{{[12][0-9]}}:
// CHECK: verify-diagnostics.mlir:32: expected error "lr must be > 0" was not produced
// CHECK-NEXT: verify-diagnostics.mlir:39:8: unexpected error: 'pock.sgd' op SGD weight_decay must be >= 0, got -1.0
// CHECK-NEXT: verify-diagnostics.mlir:48: expected error "lr must be > 0" was not produced
// CHECK-NEXT: verify-diagnostics.mlir:47:8: unexpected error: 'pock.sgd' op SGD lr must be > 0, got -1.0
// CHECK-NOT: verify-diagnostics.mlir

func.func @matched_with_regex(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.sgd' op SGD lr must be > 0, got {{-[0-9.]+}}}}
  %n = "pock.sgd"(%w, %w) {lr = -1.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @matched_on_the_same_line(%w: !torch.vtensor<[3],f32>) {
  %n = "pock.sgd"(%w, %w) {lr = -1.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32> // expected-error {{lr must be > 0}}
  return
}

// -----

func.func @expected_but_not_produced(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{lr must be > 0}}
  %n = "pock.sgd"(%w, %w) {lr = 1.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @produced_but_not_expected(%w: !torch.vtensor<[3],f32>) {
  %n = "pock.sgd"(%w, %w) {lr = 1.0 : f64, weight_decay = -1.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @expected_on_the_wrong_line(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+2 {{lr must be > 0}}
  %n = "pock.sgd"(%w, %w) {lr = -1.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}
