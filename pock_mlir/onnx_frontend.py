"""From an ONNX inference model and a loss to the torch-dialect IR import_model gives
(frontend.ImportedModel), so that an .onnx file goes through the same pipeline as an nn.Module.

The graph's float initializers are its parameters (those feeding a BatchNormalization's mean and
variance are buffers; rank-0 ones stay constants, as the exporters' scalars are), the graph's
other inputs the step's inputs. The batch's shapes replace the file's input dimensions, and ONNX
shape inference (with data propagation) runs before torch-mlir's ONNX importer, since
convert-torch-onnx-to-torch lowers only what has static types. The initializers become arguments
of the imported graph function (they are moved to the graph's inputs before import), so the
program holds them as parameters, not literals. The loss is the frontend's: the string losses and
callables of pock_mlir.frontend, traced alone with torch.export on the output's shape and called
on the graph's selected output. int64 inputs and targets travel as int32 (as in frontend.py) and
are widened back before the graph sees them. A Dropout in training mode becomes a product with a
mask input of the graph, which forward_loss computes from the step's seed by pock_mlir/dropout.py's
scheme, so that the file's dropouts draw the masks the PyTorch model's draw inside SeededDropout.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch_mlir import ir, passmanager
from torch_mlir.dialects import func
from torch_mlir.extras.fx_importer import FxImporter

from pock_mlir.abi import EVALUATE, EVALUATE_TRAIN, FORWARD_LOSS, SEED_INPUT, TensorSpec, positional_input_name
from pock_mlir.dropout import keep_mask
from pock_mlir.frontend import (
    EVAL_FORWARD_LOSS,
    FrontendError,
    ImportedModel,
    _add_evaluate,
    _export,
    as_tensor,
    call_tensors,
    device_dtype,
    resolve_loss,
    spec_of,
)
from pock_mlir.passes.base import function_named
from pock_mlir.torch_builder import TorchBuilder
from pock_mlir.torch_types import TensorType, parse_tensor_type

GRAPH_FUNCTION = "onnx_graph"  # the imported graph, called by forward_loss, inlined by the autodiff stage
EVAL_GRAPH_FUNCTION = "onnx_graph_eval"  # the graph in eval mode, where it updates statistics (in_eval_mode)
LOSS_FUNCTION = "onnx_loss"
MASKS_FUNCTION = "onnx_dropout_masks"  # the step's seed -> each training-mode Dropout's scaled mask
# The ONNX ops' lowering, then torch-mlir's decompositions of the composite ops it emits
# (aten.batch_norm, layer_norm, softmax.int, ...) into the ops pock-autodiff has rules for, as the
# FX import's core ATen decompositions give them.
TORCH_PIPELINE = (
    "builtin.module(func.func(convert-torch-onnx-to-torch,torch-scalarize-shapes,canonicalize,"
    "torch-decompose-complex-ops,canonicalize))"
)


def is_onnx_model(model) -> bool:
    """An .onnx path or an onnx.ModelProto (checked without importing onnx)."""
    if isinstance(model, (str, os.PathLike)):
        return str(model).endswith(".onnx")
    return type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx")


def load_onnx(model):
    """The ModelProto of a path or a ModelProto (with its external data)."""
    try:
        import onnx
    except ImportError:
        raise FrontendError("ONNX models need the onnx package: pip install 'pock-mlir[onnx]'") from None

    if not isinstance(model, (str, os.PathLike)):
        return model
    path = Path(model)
    if not path.is_file():
        raise FrontendError(f"{path}: no such ONNX file; give the path of a .onnx model")
    try:
        return onnx.load(path)
    except Exception as e:
        raise FrontendError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None


def _is_float(dtype_code: int) -> bool:
    import onnx

    return dtype_code == onnx.TensorProto.FLOAT


def _initializer_roles(proto) -> tuple[list[str], list[str]]:
    """(parameters, buffers): the float initializers of rank >= 1 the graph reads, BatchNormalization's
    mean and variance (its inputs 3 and 4) the buffers. Such initializers in float64 or float16 are
    refused: pock-mlir trains float32."""
    import onnx

    graph = proto.graph
    used = {name for node in graph.node for name in node.input}
    for initializer in graph.initializer:
        wide_or_half = (onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        if initializer.data_type in wide_or_half and len(initializer.dims) > 0 and initializer.name in used:
            raise FrontendError(
                f"initializer {initializer.name!r} is {onnx.TensorProto.DataType.Name(initializer.data_type).lower()}; "
                f"pock-mlir trains float32 models: export the model in float32"
            )
    statistics = {name for node in graph.node if node.op_type == "BatchNormalization" for name in node.input[3:5]}
    floats = [i.name for i in graph.initializer if _is_float(i.data_type) and len(i.dims) > 0 and i.name in used]
    return [n for n in floats if n not in statistics], [n for n in floats if n in statistics]


def onnx_parameter_shapes(proto) -> dict[str, tuple[int, ...]]:
    """The shapes of the ONNX model's parameters by initializer name (what a sparse scheme names)."""
    params, _ = _initializer_roles(proto)
    shapes = {i.name: tuple(i.dims) for i in proto.graph.initializer}
    return {n: shapes[n] for n in params}


def graph_inputs(proto) -> list:
    """The graph's inputs that are no initializer (old exporters list initializers as inputs too)."""
    initialized = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in initialized]


def _dims(value_info) -> list:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value_info.type.tensor_type.shape.dim
    ]


def _batch_by_input(proto, example_inputs) -> dict[str, torch.Tensor]:
    """The example batch by graph input name: positional tensors in the graph's input order, keyword
    tensors by input name; checked against the graph's ranks, static dimensions and dtypes."""
    import onnx

    args, kwargs = call_tensors(example_inputs)
    inputs = graph_inputs(proto)
    names = [i.name for i in inputs]
    if len(args) > len(names):
        raise FrontendError(f"{len(args)} inputs given; the ONNX graph takes {len(names)}: {', '.join(names)}")
    batch = dict(zip(names, args))
    unknown = [k for k in kwargs if k not in names or k in batch]
    if unknown:
        raise FrontendError(
            f"keyword input(s) {', '.join(unknown)}: the ONNX graph's inputs are {', '.join(names)} "
            f"(positional inputs fill them in that order)"
        )
    batch.update(kwargs)
    missing = [n for n in names if n not in batch]
    if missing:
        raise FrontendError(f"no example for the ONNX graph's input(s) {', '.join(missing)}: give one tensor per input")
    for value_info in inputs:
        tensor, dims = batch[value_info.name], _dims(value_info)
        wanted = onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)
        given = torch.empty((), dtype=tensor.dtype).numpy().dtype
        if given != wanted and not (wanted == np.int64 and given == np.int32):
            raise FrontendError(f"input {value_info.name!r} is {given}; the ONNX graph takes {wanted}")
        fits = len(dims) == tensor.dim() and all(
            not isinstance(d, int) or d in (0, s) for d, s in zip(dims, tensor.shape)
        )
        if not fits:
            shown = "(" + ", ".join(map(str, dims)) + ")"
            raise FrontendError(
                f"input {value_info.name!r} has shape {tuple(tensor.shape)}; the ONNX graph takes {shown}"
            )
    return {n: batch[n] for n in names}


def updated_statistics(proto, buffers: list[str]) -> dict[str, str]:
    """{buffer: the graph value holding its new value} for the running statistics a
    BatchNormalization in training mode (training_mode=1) updates, in buffer order."""
    found = {}
    for node in proto.graph.node:
        training = any(a.name == "training_mode" and a.i for a in node.attribute)
        if node.op_type == "BatchNormalization" and training:
            for buffer, value in zip(node.input[3:5], node.output[1:3]):
                if buffer in buffers and value:
                    found[buffer] = value
    return {b: found[b] for b in buffers if b in found}


def in_eval_mode(proto):
    """The graph with every BatchNormalization in inference mode (on its running statistics) and
    every Dropout passing its input through, as model.eval() runs the PyTorch model."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for node in copy.graph.node:
        if node.op_type == "BatchNormalization":
            kept = [a for a in node.attribute if a.name != "training_mode"]
            del node.attribute[:]
            node.attribute.extend(kept)
            del node.output[1:]
        if node.op_type == "Dropout":
            del node.input[2:]  # training_mode's default: off
    return copy


def _graph_for_import(
    proto, params: list[str], buffers: list[str], batch: dict[str, torch.Tensor], name: str = GRAPH_FUNCTION
):
    """A copy of the graph whose inputs are the parameters, the buffers, then its own inputs (the
    batch's shapes), its initializers the other ones, and whose outputs are its own, then the new
    values of the statistics it updates (updated_statistics), with ONNX's shapes inferred."""
    import onnx

    graph_proto = onnx.ModelProto()
    graph_proto.CopyFrom(proto)
    graph = graph_proto.graph
    for value in updated_statistics(proto, buffers).values():
        graph.output.append(onnx.helper.make_empty_tensor_value_info(value))
    lifted = {n: i for i in graph.initializer if (n := i.name) in set(params) | set(buffers)}
    kept = [i for i in graph.initializer if i.name not in lifted]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    own = [i for i in graph.input if i.name in batch]
    del graph.input[:]
    for state in [*params, *buffers]:
        graph.input.append(onnx.helper.make_tensor_value_info(state, lifted[state].data_type, list(lifted[state].dims)))
    for value_info in own:
        tensor = batch[value_info.name]
        elem_type = value_info.type.tensor_type.elem_type
        graph.input.append(onnx.helper.make_tensor_value_info(value_info.name, elem_type, list(tensor.shape)))
    for output in graph.output:  # inferred anew for the batch's shapes
        output.type.tensor_type.ClearField("shape")
    del graph.value_info[:]
    graph.name = name
    return _fold_shape_computations(graph_proto, set(params) | set(buffers))


def _inferred(graph_proto):
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(graph_proto, strict_mode=True, data_prop=True)
    except Exception as e:
        raise FrontendError(f"ONNX shape inference failed for the example batch: {e}") from None


def _static_shapes(graph_proto) -> dict[str, tuple[int, ...]]:
    graph = graph_proto.graph
    shapes = {}
    for value_info in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value_info.type.tensor_type
        if tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in tensor_type.shape.dim):
            shapes[value_info.name] = tuple(d.dim_value for d in tensor_type.shape.dim)
    return shapes


def _fold_shape_computations(graph_proto, state: set[str]):
    """The graph with its shape arithmetic evaluated for the batch's shapes: exporters compute
    Reshape's and Expand's shapes from Shape ops through Gather, Mod, Div, Concat, ..., which ONNX's
    data propagation follows only in part, and torch-mlir lowers such ops only with constant
    shapes. A node is folded into an initializer when its inputs are constants (not parameters
    or buffers: the step changes those) or, for Shape and Size, of a static shape; shapes are then
    inferred again, until nothing folds."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    opsets = {o.domain or "": o.version for o in graph_proto.opset_import}
    while True:
        graph_proto = _inferred(graph_proto)
        graph = graph_proto.graph
        shapes = _static_shapes(graph_proto)
        constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name not in state}
        folded, kept = [], []
        for node in graph.node:
            inputs = [name for name in node.input if name]
            value = None
            if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") and inputs[0] in shapes:
                value = ReferenceEvaluator(node, opsets=opsets).run(
                    None, {inputs[0]: np.zeros(shapes[inputs[0]], np.float32)}
                )
            elif (
                node.op_type not in _UNFOLDED and node.domain in ("", "ai.onnx") and all(n in constants for n in inputs)
            ):
                try:
                    value = ReferenceEvaluator(node, opsets=opsets).run(None, {n: constants[n] for n in inputs})
                except Exception:  # left to torch-mlir, which may lower it all the same
                    value = None
            if value is None:
                kept.append(node)
                continue
            for name, array in zip(node.output, value):
                constants[name] = np.asarray(array)
                folded.append(numpy_helper.from_array(np.asarray(array), name))
        if not folded:
            return graph_proto
        del graph.node[:]
        graph.node.extend(kept)
        graph.initializer.extend(folded)
        del graph.value_info[:]


_RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli")
_UNFOLDED = frozenset({*_RANDOM, "Dropout"})  # they draw anew each run


def _reject_random_nodes(graph_proto) -> None:
    """A node that draws random numbers (other than a Dropout: _seeded_dropouts) is refused by name:
    a compiled step cannot reproduce its draws, and dropping it would train another model."""
    for node in graph_proto.graph.node:
        if node.op_type in _RANDOM:
            raise FrontendError(
                f"ONNX node {node.name!r} ({node.op_type}) draws random numbers, which a compiled step cannot "
                f"reproduce: draw them outside the model and pass them as an input"
            )


def _seeded_dropouts(graph_proto) -> tuple[object, list[tuple[tuple[int, ...], float]]]:
    """The graph with each Dropout in training mode replaced by a product with a new graph input,
    its scaled mask, and the (shape, ratio) of each mask in the graph's order (which is the order
    of the model's dropout calls in the trace an exporter writes). Its ratio and training mode must
    be constants of the file."""
    import onnx
    from onnx import numpy_helper

    constants = {i.name: numpy_helper.to_array(i) for i in graph_proto.graph.initializer}
    shapes = _static_shapes(graph_proto)
    nodes, masks = [], []
    for node in graph_proto.graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        ratio, training = (list(node.input[1:3]) + ["", ""])[:2]
        unknown = [n for n in (ratio, training) if n and n not in constants]
        if unknown:
            raise FrontendError(
                f"ONNX node {node.name!r} is a Dropout whose {'ratio' if unknown[0] == ratio else 'training_mode'} "
                f"is computed in the graph; pock-mlir draws masks for a constant ratio and training mode: export "
                f"the model with a fixed dropout probability"
            )
        if not (training and bool(constants[training])):
            nodes.append(node)  # inference mode: the input passes through
            continue
        if node.input[0] not in shapes:
            raise FrontendError(
                f"ONNX node {node.name!r} is a Dropout whose input's shape ONNX shape inference left open: "
                f"pock-mlir needs static shapes; give the example batch's shapes (--input-shape)"
            )
        mask = f"pock_dropout_mask_{len(masks)}"
        masks.append((shapes[node.input[0]], float(constants[ratio]) if ratio else 0.5))
        nodes.append(onnx.helper.make_node("Mul", [node.input[0], mask], [node.output[0]], name=node.name))
        if len(node.output) > 1 and node.output[1]:
            nodes.append(onnx.helper.make_node("Cast", [mask], [node.output[1]], to=onnx.TensorProto.BOOL))
        graph_proto.graph.input.append(
            onnx.helper.make_tensor_value_info(mask, onnx.TensorProto.FLOAT, list(masks[-1][0]))
        )
    del graph_proto.graph.node[:]
    graph_proto.graph.node.extend(nodes)
    return graph_proto, masks


class _Masks(torch.nn.Module):
    """seed -> each dropout's mask times 1 / (1 - p), as SeededDropout.dropout scales it (a ratio
    of 0 or 1 draws no mask and takes no call number there either)."""

    def __init__(self, masks: list[tuple[tuple[int, ...], float]]):
        super().__init__()
        self.masks = masks

    def forward(self, seed):
        scaled, call = [], 0
        for shape, p in self.masks:
            if p in (0.0, 1.0):
                scaled.append(torch.full(shape, 1.0 - p))
                continue
            scaled.append(keep_mask(seed, call, shape, p).to(torch.float32) * (1.0 / (1.0 - p)))
            call += 1
        return tuple(scaled)


def _unconverted(module: ir.Module) -> list[str]:
    found = []

    def visit(op):
        if op.operation.name == "torch.operator":
            node = re.search(r'"([^"]*)"', str(op.location))
            found.append(
                f"{op.operation.attributes['name'].value} (node {node.group(1) if node else 'without a name'})"
            )
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _import_graphs(graph_protos: list, context: ir.Context) -> ir.Module:
    """One module of the graphs, each a private function named as its graph, in the torch dialect."""
    from torch_mlir.extras import onnx_importer

    module = ir.Module.create(ir.Location.unknown(context))
    try:
        for graph_proto in graph_protos:
            info = onnx_importer.ModelInfo(graph_proto)
            onnx_importer.NodeImporter.define_function(info.main_graph, module.operation, private=True).import_all()
    except onnx_importer.OnnxImportError as e:
        raise FrontendError(f"torch-mlir's ONNX importer cannot import the model: {e}") from None
    try:
        passmanager.PassManager.parse(TORCH_PIPELINE, context).run(module.operation)
    except ir.MLIRError as e:
        raise FrontendError(f"lowering the ONNX ops to torch failed: {e}") from None
    left = _unconverted(module)
    if left:
        raise FrontendError(
            f"torch-mlir lowers no ONNX op {left[0]}{f' (and {len(left) - 1} more)' if len(left) > 1 else ''} "
            f"for this opset and these types; change that node or export with another opset"
        )
    return module


class _Loss(torch.nn.Module):
    def __init__(self, loss_fn, target_dtype):
        super().__init__()
        self.loss_fn, self.target_dtype = loss_fn, target_dtype

    def forward(self, output, target):
        return self.loss_fn(output, target.to(self.target_dtype))


def _import_loss(module: ir.Module, loss, output: torch.Tensor, user_target: torch.Tensor, timings) -> None:
    """The loss as function LOSS_FUNCTION(output, device target) in `module`, traced by torch.export."""
    loss_fn = resolve_loss(loss)
    try:
        with torch.no_grad():
            value = loss_fn(output, user_target)
    except Exception as e:
        raise FrontendError(
            f"the loss failed on the model's output {tuple(output.shape)} and the target {tuple(user_target.shape)}: {e}"
        ) from None
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise FrontendError("the loss must return a scalar tensor (use a mean or sum reduction)")
    program = _export(_Loss(loss_fn, user_target.dtype), (output, device_dtype(user_target)), "loss", timings)
    FxImporter(module=module).import_frozen_program(program, func_name=LOSS_FUNCTION)
    function_named(module.operation, LOSS_FUNCTION).attributes["sym_visibility"] = ir.StringAttr.get("private")


def _vtensor(shape, dtype: torch.dtype) -> ir.Type:
    return ir.Type.parse(TensorType.of(tuple(shape), dtype).asm())


def _add_forward_loss(
    module: ir.Module,
    name: str,
    graph_name: str,
    n_state: int,
    inputs: list[torch.Tensor],
    target: torch.Tensor,
    which: int,
    n_outputs: int,
    seeded: bool = False,
    masked: bool = False,
):
    """name(params..., buffers..., inputs..., [seed,] target) -> (loss, updated buffers..., output):
    the graph on the state, the widened inputs and (masked) the dropout masks of the seed, the loss
    of its output `which` and the target; the updated buffers are the graph's results after its own
    `n_outputs`. `inputs` include the seed when `seeded`."""
    graph = function_named(module.operation, graph_name)
    loss = function_named(module.operation, LOSS_FUNCTION)
    graph_type = ir.FunctionType(graph.type)
    state_types = list(graph_type.inputs[:n_state])
    argument_types = state_types + [_vtensor(t.shape, t.dtype) for t in inputs] + [_vtensor(target.shape, target.dtype)]
    result_types = [ir.FunctionType(loss.type).results[0], *graph_type.results[n_outputs:], graph_type.results[which]]
    loc = ir.Location.name(name)
    with loc, ir.InsertionPoint(module.body):
        block = func.FuncOp(name, (argument_types, result_types)).add_entry_block()
    with loc, ir.InsertionPoint(block) as ip:
        b = TorchBuilder(ip, loc)
        arguments = list(block.arguments)
        own = arguments[n_state : -2 if seeded else -1]
        widened = [
            b.cast(value, torch.int64) if parse_tensor_type(wanted).element == "si64" else value
            for value, wanted in zip(own, graph_type.inputs[n_state:])
        ]
        masks = (
            list(func.CallOp(function_named(module.operation, MASKS_FUNCTION), [arguments[-2]]).results)
            if masked
            else []
        )
        outputs = func.CallOp(graph, arguments[:n_state] + widened + masks).results
        value = func.CallOp(loss, [outputs[which], arguments[-1]]).results[0]
        func.ReturnOp([value, *list(outputs)[n_outputs:], outputs[which]])


def _output_index(proto, selector) -> int:
    names = [o.name for o in proto.graph.output]
    if selector is None:
        return 0
    if selector in names:
        return names.index(selector)
    if isinstance(selector, int) and 0 <= selector < len(names):
        return selector
    raise FrontendError(f"output={selector!r}: the ONNX graph's outputs are {', '.join(map(repr, names))}")


def _static_output_shape(graph_proto, which: int) -> tuple[int, ...]:
    output = graph_proto.graph.output[which]
    dims = _dims(output)
    if not all(isinstance(d, int) and d > 0 for d in dims):
        raise FrontendError(
            f"ONNX shape inference left output {output.name!r} with shape ({', '.join(map(str, dims))}): "
            f"pock-mlir needs static shapes; give the example batch's shapes (--input-shape)"
        )
    return tuple(dims)


def example_batch(model, input_shapes: dict[str, tuple[int, ...]], loss: str, output_selector=None):
    """Zero inputs of the graph's input shapes (the file's static dimensions, or `input_shapes` by
    input name) and a zero target for the string loss `loss` on the selected output: class indices
    for cross_entropy (the output's shape less its class dimension 1), the output's shape for mse.
    What pock-compile compiles an .onnx file with."""
    import onnx

    proto = load_onnx(model)
    inputs = graph_inputs(proto)
    names = [i.name for i in inputs]
    unknown = [n for n in input_shapes if n not in names]
    if unknown:
        raise FrontendError(f"--input-shape {unknown[0]}: the ONNX graph's inputs are {', '.join(names)}")
    batch = {}
    for value_info in inputs:
        dims = input_shapes.get(value_info.name, _dims(value_info))
        if not all(isinstance(d, int) and d > 0 for d in dims):
            shown = "x".join(map(str, dims))
            raise FrontendError(
                f"input {value_info.name!r} has shape {shown} in the file; give its size: "
                f"--input-shape {value_info.name}={'x'.join(str(d) if isinstance(d, int) and d > 0 else 'N' for d in dims)}"
            )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type)
        batch[value_info.name] = torch.from_numpy(np.zeros(dims, dtype))
    params, buffers = _initializer_roles(proto)
    which = _output_index(proto, output_selector)
    shape = _static_output_shape(_graph_for_import(proto, params, buffers, _batch_by_input(proto, batch)), which)
    if loss == "cross_entropy":
        target = torch.zeros(shape[:1] + shape[2:], dtype=torch.int64)
    elif loss == "mse":
        target = torch.zeros(shape)
    else:
        raise FrontendError(f"loss {loss!r}: an .onnx file compiles with cross_entropy or mse")
    return tuple(batch.values()), target


# Ops that pass every id of an integer tensor on unchanged: ids reaching a Gather through them are
# all the input's ids (as frontend._IDS_KEPT for the FX graph).
_IDS_KEPT = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Expand"})


def embedding_vocabularies(proto, params: list[str], input_names: dict[str, str]) -> dict[str, int]:
    """For each graph input whose ids index a parameter's rows (Gather on axis 0, through casts and
    views only), the fewest rows they index: the ids the runtime accepts, checked on the host (the
    device would read out of bounds). input_names: graph input -> its name in the signature."""
    rows = {i.name: i.dims[0] for i in proto.graph.initializer if i.name in set(params) and i.dims}
    producer = {out: node for node in proto.graph.node for out in node.output}
    vocabularies: dict[str, int] = {}
    for node in proto.graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type != "Gather" or axis != 0 or node.input[0] not in rows:
            continue
        ids = node.input[1]
        while ids in producer and producer[ids].op_type in _IDS_KEPT:
            ids = producer[ids].input[0]
        if ids in input_names:
            name = input_names[ids]
            vocabularies[name] = min(rows[node.input[0]], vocabularies.get(name, rows[node.input[0]]))
    return vocabularies


def import_onnx(
    model, example_inputs, example_target, loss, context: ir.Context, output_selector=None
) -> ImportedModel:
    """An ImportedModel of the ONNX model (a path or onnx.ModelProto) as frontend.import_model
    gives of an nn.Module: functions forward_loss, evaluate and evaluate_train."""
    proto = load_onnx(model)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    params, buffers = _initializer_roles(proto)
    if not params:
        raise FrontendError("the ONNX model has no float initializers: nothing to train")
    batch = _batch_by_input(proto, example_inputs)
    user_target = as_tensor(example_target)
    which = _output_index(proto, output_selector)
    updated = updated_statistics(proto, buffers)
    graph_proto, masks = _seeded_dropouts(_graph_for_import(proto, params, buffers, batch))
    graph_protos = [graph_proto]
    modes_differ = bool(updated or masks)
    if modes_differ:  # evaluate and the validation loss run the model as model.eval() does
        graph_protos.append(_graph_for_import(in_eval_mode(proto), params, buffers, batch, EVAL_GRAPH_FUNCTION))
    _reject_random_nodes(graph_protos[0])
    timings["ONNX shape inference"] = time.perf_counter() - start
    output_shape = _static_output_shape(graph_protos[0], which)

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = _import_graphs(graph_protos, context)
    timings["ONNX import and lowering to torch"] = time.perf_counter() - start
    output = torch.zeros(output_shape)
    _import_loss(module, loss, output, user_target, timings)
    inputs = [device_dtype(t) for t in batch.values()]
    names = [positional_input_name(i) for i in range(len(inputs))]
    if masks:
        program = _export(_Masks(masks), (torch.zeros((), dtype=torch.int32),), "dropout masks", timings)
        FxImporter(module=module).import_frozen_program(program, func_name=MASKS_FUNCTION)
        function_named(module.operation, MASKS_FUNCTION).attributes["sym_visibility"] = ir.StringAttr.get("private")
        inputs.append(torch.zeros((), dtype=torch.int32))
        names.append(SEED_INPUT)
    target = device_dtype(user_target)
    n_state, n_outputs = len(params) + len(buffers), len(proto.graph.output)
    seeded = bool(masks)
    _add_forward_loss(
        module, FORWARD_LOSS, GRAPH_FUNCTION, n_state, inputs, target, which, n_outputs, seeded=seeded, masked=seeded
    )
    eval_function = EVAL_FORWARD_LOSS if modes_differ else FORWARD_LOSS
    if modes_differ:
        _add_forward_loss(
            module, EVAL_FORWARD_LOSS, EVAL_GRAPH_FUNCTION, n_state, inputs, target, which, n_outputs, seeded=seeded
        )
    _add_evaluate(module, EVALUATE, eval_function)
    _add_evaluate(module, EVALUATE_TRAIN, FORWARD_LOSS)

    values = {i.name: i for i in proto.graph.initializer}
    import onnx.numpy_helper

    initial = {n: onnx.numpy_helper.to_array(values[n]).astype(np.float32, copy=True) for n in params + buffers}
    return ImportedModel(
        module=module,
        params=[TensorSpec(n, initial[n].shape, "float32") for n in params],
        buffers=[TensorSpec(n, initial[n].shape, "float32") for n in buffers],
        updated_buffers=list(updated),
        inputs=[spec_of(name, t) for name, t in zip(names, inputs)],
        target=spec_of("target", target),
        output=TensorSpec(proto.graph.output[which].name, output_shape, "float32"),
        initial_params={n: initial[n] for n in params},
        initial_buffers={n: initial[n] for n in buffers},
        state_dict={n: n for n in params + buffers},
        vocabularies=embedding_vocabularies(proto, params, {n: positional_input_name(i) for i, n in enumerate(batch)}),
        eval_function=eval_function,
        timings=timings,
        by_keyword=0,
    )
