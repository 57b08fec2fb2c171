// RUN: pock-opt --split-input-file --verify-diagnostics %s

// One case per verifier rule of every pock op; MLIR stops at the first failing op, so each
// case is its own chunk. The IRDL cases show that a missing or mistyped field is named by
// IRDL's own verifier rather than tripping over the Python rules.

func.func @param_value_not_float(%w: !torch.vtensor<[3],si64>) {
  // expected-error @+1 {{'pock.param' op value must be a !torch.vtensor, floating-point unless frozen, got !torch.vtensor<[3],si64>}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],si64>) -> !torch.vtensor<[3],si64>
  return
}

// -----

func.func @param_unknown_policy(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op policy must be one of full, frozen, bias, channels, got 'sparse'}}
  %p = "pock.param"(%w) {param_name = "w", policy = "sparse", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @param_ratio_zero(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op ratio must be in (0.0, 1.0], got 0.0}}
  %p = "pock.param"(%w) {param_name = "w", policy = "channels", ratio = 0.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @param_ratio_above_one(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op ratio must be in (0.0, 1.0], got 1.5}}
  %p = "pock.param"(%w) {param_name = "w", policy = "channels", ratio = 1.5 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @param_partial_ratio_without_channels_policy(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op ratio must be 1.0 unless policy is 'channels', got 0.5}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 0.5 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @param_channels_policy_on_scalar(%w: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.param' op policy 'channels' needs a tensor with an output-channel dimension, got a scalar}}
  %p = "pock.param"(%w) {param_name = "w", policy = "channels", ratio = 0.5 : f64} : (!torch.vtensor<[],f32>) -> !torch.vtensor<[],f32>
  return
}

// -----

func.func @param_result_type_differs(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op result type !torch.vtensor<[4],f32> must equal value type !torch.vtensor<[3],f32>}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[4],f32>
  return
}

// -----

func.func @param_dynamic_shape(%w: !torch.vtensor<[?,3],f32>) {
  // expected-error @+1 {{'pock.param' op dynamic shapes are not supported: !torch.vtensor<[?,3],f32>}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[?,3],f32>) -> !torch.vtensor<[?,3],f32>
  return
}

// -----

func.func @param_missing_attribute(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.param' op attribute "ratio" is expected but not provided}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full"} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @param_attribute_of_wrong_kind(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{expected base attribute 'builtin.float' but got 'builtin.integer'}}
  %p = "pock.param"(%w) {param_name = "w", policy = "full", ratio = 1 : i64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @grad_loss_not_scalar(%loss: !torch.vtensor<[2],f32>, %w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.grad' op loss must be a rank-0 float !torch.vtensor, got !torch.vtensor<[2],f32>}}
  %g = "pock.grad"(%loss, %w) : (!torch.vtensor<[2],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @grad_loss_not_float(%loss: !torch.vtensor<[],si64>, %w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.grad' op loss must be a rank-0 float !torch.vtensor, got !torch.vtensor<[],si64>}}
  %g = "pock.grad"(%loss, %w) : (!torch.vtensor<[],si64>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @grad_dtype_differs(%loss: !torch.vtensor<[],f32>, %w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.grad' op gradient type !torch.vtensor<[3],f64> must match parameter type !torch.vtensor<[3],f32>}}
  %g = "pock.grad"(%loss, %w) : (!torch.vtensor<[],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f64>
  return
}

// -----

func.func @grad_trailing_dims_differ(%loss: !torch.vtensor<[],f32>, %w: !torch.vtensor<[4,3],f32>) {
  // expected-error @+1 {{'pock.grad' op gradient type !torch.vtensor<[4,2],f32> must match parameter type !torch.vtensor<[4,3],f32>}}
  %g = "pock.grad"(%loss, %w) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[4,2],f32>
  return
}

// -----

func.func @grad_more_channels_than_param(%loss: !torch.vtensor<[],f32>, %w: !torch.vtensor<[4,3],f32>) {
  // expected-error @+1 {{'pock.grad' op gradient covers 5 channels, must be 1..4}}
  %g = "pock.grad"(%loss, %w) : (!torch.vtensor<[],f32>, !torch.vtensor<[4,3],f32>) -> !torch.vtensor<[5,3],f32>
  return
}

// -----

func.func @sgd_param_not_float(%w: !torch.vtensor<[3],si64>) {
  // expected-error @+1 {{'pock.sgd' op param must be a floating-point !torch.vtensor, got !torch.vtensor<[3],si64>}}
  %n = "pock.sgd"(%w, %w) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>) -> !torch.vtensor<[3],si64>
  return
}

// -----

func.func @sgd_grad_type_differs(%w: !torch.vtensor<[3],f32>, %g: !torch.vtensor<[4],f32>) {
  // expected-error @+1 {{'pock.sgd' op grad type !torch.vtensor<[4],f32> must equal param type !torch.vtensor<[3],f32>}}
  %n = "pock.sgd"(%w, %g) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[4],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @sgd_result_type_differs(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.sgd' op new_param type !torch.vtensor<[3],f64> must equal param type !torch.vtensor<[3],f32>}}
  %n = "pock.sgd"(%w, %w) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f64>
  return
}

// -----

func.func @sgd_lr_zero(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.sgd' op SGD lr must be > 0, got 0.0}}
  %n = "pock.sgd"(%w, %w) {lr = 0.0 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @sgd_negative_weight_decay(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{'pock.sgd' op SGD weight_decay must be >= 0, got -0.01}}
  %n = "pock.sgd"(%w, %w) {lr = 0.1 : f64, weight_decay = -0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @sgd_missing_operand(%w: !torch.vtensor<[3],f32>) {
  // expected-error @+1 {{op expects exactly 2 operands, but got 1}}
  %n = "pock.sgd"(%w) {lr = 0.1 : f64, weight_decay = 0.0 : f64} : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
  return
}

// -----

func.func @sgd_momentum_param_not_float(%w: !torch.vtensor<[3],si64>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op param must be a floating-point !torch.vtensor, got !torch.vtensor<[3],si64>}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>)
  return
}

// -----

func.func @sgd_momentum_buffer_type_differs(%w: !torch.vtensor<[3],f32>, %buf: !torch.vtensor<[3],f64>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op momentum_buffer type !torch.vtensor<[3],f64> must equal param type !torch.vtensor<[3],f32>}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %buf, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f64>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @sgd_momentum_new_buffer_type_differs(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op new_momentum_buffer type !torch.vtensor<[4],f32> must equal param type !torch.vtensor<[3],f32>}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[4],f32>)
  return
}

// -----

func.func @sgd_momentum_step_not_scalar(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[1],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op step must be a rank-0 float !torch.vtensor (steps taken so far), got !torch.vtensor<[1],f32>}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[1],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @sgd_momentum_negative_lr(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op SGD lr must be > 0, got -0.1}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = -0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @sgd_momentum_negative_momentum(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op SGD momentum must be >= 0, got -0.5}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = -0.5 : f64, dampening = 0.0 : f64, weight_decay = 0.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @sgd_momentum_negative_weight_decay(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op SGD weight_decay must be >= 0, got -1.0}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.0 : f64, weight_decay = -1.0 : f64, nesterov = false} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @sgd_momentum_nesterov_with_dampening(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.sgd_momentum' op SGD nesterov momentum requires momentum > 0 and dampening 0, got momentum 0.9 and dampening 0.1}}
  %n:2 = "pock.sgd_momentum"(%w, %w, %w, %step) {lr = 0.1 : f64, momentum = 0.9 : f64, dampening = 0.1 : f64, weight_decay = 0.0 : f64, nesterov = true} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_param_not_float(%w: !torch.vtensor<[3],si64>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op param must be a floating-point !torch.vtensor, got !torch.vtensor<[3],si64>}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>, !torch.vtensor<[3],si64>)
  return
}

// -----

func.func @adamw_exp_avg_sq_type_differs(%w: !torch.vtensor<[3],f32>, %v: !torch.vtensor<[1,3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op exp_avg_sq type !torch.vtensor<[1,3],f32> must equal param type !torch.vtensor<[3],f32>}}
  %n:3 = "pock.adamw"(%w, %w, %w, %v, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[1,3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_new_exp_avg_type_differs(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op new_exp_avg type !torch.vtensor<[3],f16> must equal param type !torch.vtensor<[3],f32>}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f16>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_integer_step(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],si64>) {
  // expected-error @+1 {{'pock.adamw' op step must be a rank-0 float !torch.vtensor (steps taken so far), got !torch.vtensor<[],si64>}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],si64>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_lr_zero(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op AdamW lr must be > 0, got 0.0}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.0 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_beta1_one(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op AdamW betas must be in [0, 1), got (1.0, 0.999)}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 1.0 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_negative_beta2(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op AdamW betas must be in [0, 1), got (0.9, -0.5)}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = -0.5 : f64, eps = 1.0e-8 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_eps_zero(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op AdamW eps must be > 0, got 0.0}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 0.0 : f64, weight_decay = 0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @adamw_negative_weight_decay(%w: !torch.vtensor<[3],f32>, %step: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.adamw' op AdamW weight_decay must be >= 0, got -0.01}}
  %n:3 = "pock.adamw"(%w, %w, %w, %w, %step) {lr = 0.001 : f64, beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = -0.01 : f64} : (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[],f32>) -> (!torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>, !torch.vtensor<[3],f32>)
  return
}

// -----

func.func @channel_slice_of_scalar(%w: !torch.vtensor<[],f32>) {
  // expected-error @+1 {{'pock.channel_slice' op value must be a tensor of rank >= 1, got !torch.vtensor<[],f32>}}
  %s = "pock.channel_slice"(%w) {channels = 1 : i64} : (!torch.vtensor<[],f32>) -> !torch.vtensor<[],f32>
  return
}

// -----

func.func @channel_slice_zero_channels(%w: !torch.vtensor<[8,3],f32>) {
  // expected-error @+1 {{'pock.channel_slice' op channels must be in [1, 8], got 0}}
  %s = "pock.channel_slice"(%w) {channels = 0 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[0,3],f32>
  return
}

// -----

func.func @channel_slice_more_channels_than_value(%w: !torch.vtensor<[8,3],f32>) {
  // expected-error @+1 {{'pock.channel_slice' op channels must be in [1, 8], got 9}}
  %s = "pock.channel_slice"(%w) {channels = 9 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[9,3],f32>
  return
}

// -----

func.func @channel_slice_result_type_differs(%w: !torch.vtensor<[8,3],f32>) {
  // expected-error @+1 {{'pock.channel_slice' op result type !torch.vtensor<[3,3],f32> must be the first 2 channels of !torch.vtensor<[8,3],f32>}}
  %s = "pock.channel_slice"(%w) {channels = 2 : i64} : (!torch.vtensor<[8,3],f32>) -> !torch.vtensor<[3,3],f32>
  return
}

// -----

func.func @channel_update_wider_than_param(%w: !torch.vtensor<[8,3],f32>, %u: !torch.vtensor<[9,3],f32>) {
  // expected-error @+1 {{'pock.channel_update' op update type !torch.vtensor<[9,3],f32> must be a leading channel slice of param type !torch.vtensor<[8,3],f32>}}
  %r = "pock.channel_update"(%w, %u) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[9,3],f32>) -> !torch.vtensor<[8,3],f32>
  return
}

// -----

func.func @channel_update_trailing_dims_differ(%w: !torch.vtensor<[8,3],f32>, %u: !torch.vtensor<[2,4],f32>) {
  // expected-error @+1 {{'pock.channel_update' op update type !torch.vtensor<[2,4],f32> must be a leading channel slice of param type !torch.vtensor<[8,3],f32>}}
  %r = "pock.channel_update"(%w, %u) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[8,3],f32>
  return
}

// -----

func.func @channel_update_dtype_differs(%w: !torch.vtensor<[8,3],f32>, %u: !torch.vtensor<[2,3],f16>) {
  // expected-error @+1 {{'pock.channel_update' op update type !torch.vtensor<[2,3],f16> must be a leading channel slice of param type !torch.vtensor<[8,3],f32>}}
  %r = "pock.channel_update"(%w, %u) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f16>) -> !torch.vtensor<[8,3],f32>
  return
}

// -----

func.func @channel_update_result_type_differs(%w: !torch.vtensor<[8,3],f32>, %u: !torch.vtensor<[2,3],f32>) {
  // expected-error @+1 {{'pock.channel_update' op result type !torch.vtensor<[2,3],f32> must equal param type !torch.vtensor<[8,3],f32>}}
  %r = "pock.channel_update"(%w, %u) : (!torch.vtensor<[8,3],f32>, !torch.vtensor<[2,3],f32>) -> !torch.vtensor<[2,3],f32>
  return
}
