// RUN: pock-opt --split-input-file -p pock-autodiff %s | filecheck %s

// The backward IR the transformer rules emit (pock_mlir/autodiff/rules/transformer.py).
// Each loss is a plain sum, so the incoming cotangent is the expanded seed of ones.

// LayerNorm decomposes into var_mean, rsqrt and arithmetic. rsqrt: -g y^3 / 2; var_mean
// (correction 0, 4 elements per row): 2 g_var (x - mean) / 4 + g_mean / 4.

// CHECK-LABEL: func.func @layer_norm_statistics
// CHECK: %[[X:.*]] = "pock.param"
// CHECK: %[[VAR:.*]], %[[MEAN:.*]] = torch.aten.var_mean.correction %[[X]]
// CHECK: %[[R:.*]] = torch.aten.rsqrt
// CHECK: %[[R2:.*]] = torch.aten.mul.Tensor %[[R]], %[[R]]
// CHECK: %[[R3:.*]] = torch.aten.mul.Tensor %[[R2]], %[[R]]
// CHECK: %[[GR:.*]] = torch.aten.mul.Tensor %{{.*}}, %[[R3]]
// CHECK: %[[HALF:.*]] = torch.constant.float -5.000000e-01
// CHECK: %[[GVAR:.*]] = torch.aten.mul.Scalar %[[GR]], %[[HALF]] : !torch.vtensor<[2,1],f32>
// CHECK: %[[MEANX:.*]] = torch.aten.expand %[[MEAN]], {{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK: %[[GMEAN:.*]] = torch.aten.div.Scalar %{{.*}}, %{{.*}} : !torch.vtensor<[2,4],f32>
// CHECK: %[[CENTERED:.*]] = torch.aten.sub.Tensor %[[X]], %[[MEANX]]
// CHECK: %[[GVARX:.*]] = torch.aten.expand %[[GVAR]]
// CHECK: %[[PROD:.*]] = torch.aten.mul.Tensor %[[CENTERED]], %[[GVARX]]
// CHECK: %[[SCALE:.*]] = torch.constant.float 5.000000e-01
// CHECK: %[[GX:.*]] = torch.aten.mul.Scalar %[[PROD]], %[[SCALE]]
// CHECK: torch.aten.add.Tensor %[[GX]], %[[GMEAN]]
func.func @layer_norm_statistics(%w: !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32> {
  %p = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %int-1 = torch.constant.int -1
  %dims = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
  %int0 = torch.constant.int 0
  %true = torch.constant.bool true
  %var, %mean = torch.aten.var_mean.correction %p, %dims, %int0, %true : !torch.vtensor<[2,4],f32>, !torch.list<int>, !torch.int, !torch.bool -> !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32>
  %eps = torch.constant.float 1.0e-05
  %int1 = torch.constant.int 1
  %ve = torch.aten.add.Scalar %var, %eps, %int1 : !torch.vtensor<[2,1],f32>, !torch.float, !torch.int -> !torch.vtensor<[2,1],f32>
  %r = torch.aten.rsqrt %ve : !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,1],f32>
  %c = torch.aten.sub.Tensor %p, %mean, %int1 : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,1],f32>, !torch.int -> !torch.vtensor<[2,4],f32>
  %y = torch.aten.mul.Tensor %c, %r : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,1],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  return %g : !torch.vtensor<[2,4],f32>
}

// -----

// softmax: y (g - sum(g y, dim, keepdim)).

// CHECK-LABEL: func.func @softmax
// CHECK: %[[Y:.*]] = torch.aten._softmax
// CHECK: %[[G:.*]] = torch.aten.add.Tensor
// CHECK: %[[GY:.*]] = torch.aten.mul.Tensor %[[G]], %[[Y]]
// CHECK: %[[TRUE:.*]] = torch.constant.bool true
// CHECK: %[[S:.*]] = torch.aten.sum.dim_IntList %[[GY]], %{{.*}}, %[[TRUE]], %{{.*}} -> !torch.vtensor<[2,1],f32>
// CHECK: %[[D:.*]] = torch.aten.sub.Tensor %[[G]], %[[S]]
// CHECK: %[[GX:.*]] = torch.aten.mul.Tensor %[[Y]], %[[D]]
// CHECK: return %[[GX]]
func.func @softmax(%w: !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32> {
  %p = "pock.param"(%w) {param_name = "x", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %int-1 = torch.constant.int -1
  %false = torch.constant.bool false
  %y = torch.aten._softmax %p, %int-1, %false : !torch.vtensor<[2,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4],f32>
  %yy = torch.aten.mul.Tensor %y, %y : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %yy, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  return %g : !torch.vtensor<[2,4],f32>
}

// -----

// log_softmax: g - exp(y) sum(g, dim, keepdim). Under a cross-entropy, g is the gather's one-hot
// routing of its cotangent (one position per row), whose sum along the classes is that cotangent:
// no reduction over the logits.

// CHECK-LABEL: func.func @cross_entropy
// CHECK: %[[Y:.*]] = torch.aten._log_softmax
// CHECK: %[[PICK:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[2,1],f32>
// CHECK: %[[ONEHOT:.*]] = torch.aten.where.self %{{.*}}, %[[PICK]], %{{.*}} -> !torch.vtensor<[2,4],f32>
// CHECK-NOT: torch.aten.sum.dim_IntList
// CHECK: %[[E:.*]] = torch.aten.exp %[[Y]]
// CHECK: %[[EG:.*]] = torch.aten.mul.Tensor %[[E]], %[[PICK]]
// CHECK: %[[GX:.*]] = torch.aten.sub.Tensor %[[ONEHOT]], %[[EG]]
// CHECK: return %[[GX]]

// A sum of g that is not one-hot is a reduction still.
// CHECK-LABEL: func.func @log_softmax_summed
// CHECK: %[[Y:.*]] = torch.aten._log_softmax
// CHECK: %[[S:.*]] = torch.aten.sum.dim_IntList {{.*}} -> !torch.vtensor<[2,1],f32>
// CHECK: torch.aten.mul.Tensor %{{.*}}, %[[S]]
func.func @cross_entropy(%w: !torch.vtensor<[2,4],f32>, %t: !torch.vtensor<[2,1],si64>) -> !torch.vtensor<[2,4],f32> {
  %p = "pock.param"(%w) {param_name = "logits", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %y = torch.aten._log_softmax %p, %int1, %false : !torch.vtensor<[2,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4],f32>
  %picked = torch.aten.gather %y, %int1, %t, %false : !torch.vtensor<[2,4],f32>, !torch.int, !torch.vtensor<[2,1],si64>, !torch.bool -> !torch.vtensor<[2,1],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %picked, %none : !torch.vtensor<[2,1],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  return %g : !torch.vtensor<[2,4],f32>
}

func.func @log_softmax_summed(%w: !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32> {
  %p = "pock.param"(%w) {param_name = "logits", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  %int1 = torch.constant.int 1
  %false = torch.constant.bool false
  %y = torch.aten._log_softmax %p, %int1, %false : !torch.vtensor<[2,4],f32>, !torch.int, !torch.bool -> !torch.vtensor<[2,4],f32>
  %yy = torch.aten.mul.Tensor %y, %y : !torch.vtensor<[2,4],f32>, !torch.vtensor<[2,4],f32> -> !torch.vtensor<[2,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %yy, %none : !torch.vtensor<[2,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[2,4],f32>) -> !torch.vtensor<[2,4],f32>
  return %g : !torch.vtensor<[2,4],f32>
}

// -----

// bmm: bmm(g, k^T) and bmm(q^T, g), batched matmuls rather than loops.

// CHECK-LABEL: func.func @bmm
// CHECK: %[[Q:.*]] = "pock.param"(%arg0)
// CHECK: %[[K:.*]] = "pock.param"(%arg1)
// CHECK: %[[G:.*]] = torch.aten.expand {{.*}} -> !torch.vtensor<[3,2,5],f32>
// CHECK: %[[KT:.*]] = torch.aten.transpose.int %[[K]], {{.*}} -> !torch.vtensor<[3,5,4],f32>
// CHECK: %[[GQ:.*]] = torch.aten.bmm %[[G]], %[[KT]] {{.*}} -> !torch.vtensor<[3,2,4],f32>
// CHECK: %[[QT:.*]] = torch.aten.transpose.int %[[Q]], {{.*}} -> !torch.vtensor<[3,4,2],f32>
// CHECK: %[[GK:.*]] = torch.aten.bmm %[[QT]], %[[G]] {{.*}} -> !torch.vtensor<[3,4,5],f32>
// CHECK: return %[[GQ]], %[[GK]]
func.func @bmm(%q: !torch.vtensor<[3,2,4],f32>, %w: !torch.vtensor<[3,4,5],f32>) -> (!torch.vtensor<[3,2,4],f32>, !torch.vtensor<[3,4,5],f32>) {
  %pq = "pock.param"(%q) {param_name = "q", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3,2,4],f32>) -> !torch.vtensor<[3,2,4],f32>
  %pk = "pock.param"(%w) {param_name = "k", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[3,4,5],f32>) -> !torch.vtensor<[3,4,5],f32>
  %y = torch.aten.bmm %pq, %pk : !torch.vtensor<[3,2,4],f32>, !torch.vtensor<[3,4,5],f32> -> !torch.vtensor<[3,2,5],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %y, %none : !torch.vtensor<[3,2,5],f32>, !torch.none -> !torch.vtensor<[],f32>
  %gq = "pock.grad"(%loss, %pq) : (!torch.vtensor<[],f32>, !torch.vtensor<[3,2,4],f32>) -> !torch.vtensor<[3,2,4],f32>
  %gk = "pock.grad"(%loss, %pk) : (!torch.vtensor<[],f32>, !torch.vtensor<[3,4,5],f32>) -> !torch.vtensor<[3,4,5],f32>
  return %gq, %gk : !torch.vtensor<[3,2,4],f32>, !torch.vtensor<[3,4,5],f32>
}

// -----

// embedding: the cotangent rows of padding tokens are zeroed, then scattered with an
// accumulating index_put (one scatter in IREE) into zeros of the table's shape.

// CHECK-LABEL: func.func @embedding_with_padding_idx
// CHECK-SAME: %[[IDS:[^:]+]]: !torch.vtensor<[2,3],si32>
// CHECK: %[[FLAT:.*]] = torch.aten.view %[[IDS]], {{.*}} -> !torch.vtensor<[6],si32>
// CHECK: %[[ROWS:.*]] = torch.aten.view {{.*}} -> !torch.vtensor<[6,4],f32>
// CHECK: %[[PAD:.*]] = torch.aten.eq.Scalar %[[FLAT]], %{{.*}} -> !torch.vtensor<[6],i1>
// CHECK: %[[PADCOL:.*]] = torch.aten.unsqueeze %[[PAD]]
// CHECK: %[[KEPT:.*]] = torch.aten.where.self %[[PADCOL]], %{{.*}}, %[[ROWS]]
// CHECK: %[[ZEROS:.*]] = torch.aten.full {{.*}} -> !torch.vtensor<[10,4],f32>
// CHECK: %[[INDICES:.*]] = torch.prim.ListConstruct %[[FLAT]]
// CHECK: %[[ACC:.*]] = torch.constant.bool true
// CHECK: %[[GW:.*]] = torch.aten.index_put %[[ZEROS]], %[[INDICES]], %[[KEPT]], %[[ACC]]
// CHECK: return %[[GW]]
func.func @embedding_with_padding_idx(%w: !torch.vtensor<[10,4],f32>, %ids: !torch.vtensor<[2,3],si32>) -> !torch.vtensor<[10,4],f32> {
  %p = "pock.param"(%w) {param_name = "tokens.weight", policy = "full", ratio = 1.0 : f64} : (!torch.vtensor<[10,4],f32>) -> !torch.vtensor<[10,4],f32>
  %pad = torch.constant.int 0
  %false = torch.constant.bool false
  %e = torch.aten.embedding %p, %ids, %pad, %false, %false : !torch.vtensor<[10,4],f32>, !torch.vtensor<[2,3],si32>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[2,3,4],f32>
  %none = torch.constant.none
  %loss = torch.aten.sum %e, %none : !torch.vtensor<[2,3,4],f32>, !torch.none -> !torch.vtensor<[],f32>
  %g = "pock.grad"(%loss, %p) : (!torch.vtensor<[],f32>, !torch.vtensor<[10,4],f32>) -> !torch.vtensor<[10,4],f32>
  return %g : !torch.vtensor<[10,4],f32>
}
