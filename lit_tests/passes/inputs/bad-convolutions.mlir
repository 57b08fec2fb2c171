// Convolutions whose attributes, operands and result do not fit together (found by
// tests/test_fuzz_pock_opt.py): pock-backend-switch reports each at the op.

func.func @negative_stride(%g: !torch.vtensor<[2,4,8,8],f32>, %x: !torch.vtensor<[2,3,8,8],f32>, %w: !torch.vtensor<[4,3,3,3],f32>) -> !torch.vtensor<[4,3,3,3],f32> {
  %false = torch.constant.bool false
  %true = torch.constant.bool true
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %intm1 = torch.constant.int -1
  %stride = torch.prim.ListConstruct %intm1, %intm1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  %mask = torch.prim.ListConstruct %false, %true, %false : (!torch.bool, !torch.bool, !torch.bool) -> !torch.list<bool>
  // expected-error @+1 {{pock-backend-switch: torch.aten.convolution_backward: its operands and result do not fit each other: stride [-1, -1] and dilation [1, 1] must be positive}}
  %r0, %r1, %r2 = torch.aten.convolution_backward %g, %x, %w, %none, %stride, %pad, %dil, %false, %outpad, %int1, %mask : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[2,3,8,8],f32>, !torch.vtensor<[4,3,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int, !torch.list<bool> -> !torch.none, !torch.vtensor<[4,3,3,3],f32>, !torch.none
  return %r1 : !torch.vtensor<[4,3,3,3],f32>
}

// -----

func.func @groups_do_not_divide(%x: !torch.vtensor<[2,4,8,8],f32>, %w: !torch.vtensor<[4,1,3,3],f32>) -> !torch.vtensor<[2,4,8,8],f32> {
  %false = torch.constant.bool false
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %int32 = torch.constant.int 32
  %stride = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error @+1 {{pock-backend-switch: torch.aten.convolution: its operands and result do not fit each other: input [2, 4, 8, 8] and weight [4, 1, 3, 3] do not fit 32 group(s)}}
  %y = torch.aten.convolution %x, %w, %none, %stride, %pad, %dil, %false, %outpad, %int32 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[4,1,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,8,8],f32>
  return %y : !torch.vtensor<[2,4,8,8],f32>
}

// -----

func.func @result_does_not_fit(%x: !torch.vtensor<[2,4,8,8],f32>, %w: !torch.vtensor<[4,4,3,3],f32>) -> !torch.vtensor<[2,4,5,5],f32> {
  %false = torch.constant.bool false
  %none = torch.constant.none
  %int1 = torch.constant.int 1
  %int0 = torch.constant.int 0
  %stride = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %pad = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %dil = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
  %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
  // expected-error @+1 {{its operands and result do not fit each other: it gives [2, 4, 8, 8], not the declared [2, 4, 5, 5]}}
  %y = torch.aten.convolution %x, %w, %none, %stride, %pad, %dil, %false, %outpad, %int1 : !torch.vtensor<[2,4,8,8],f32>, !torch.vtensor<[4,4,3,3],f32>, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> !torch.vtensor<[2,4,5,5],f32>
  return %y : !torch.vtensor<[2,4,5,5],f32>
}
