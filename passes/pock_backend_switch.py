"""pock-backend-switch: give each convolution and each convolution gradient the form measured
fastest on the target, and choose whether IREE data-tiles the program's matmuls.

pock-autodiff leaves each convolution's gradients as abstract aten.convolution_backward ops, one
per gradient. This pass gives every aten.convolution and every gradient of an
aten.convolution_backward one of the forms of pock_mlir/conv_forms.py: "direct" (the op itself),
"im2col" (windows unfolded, one matmul per group, col2im for the input gradient), depthwise
"patches" (per-tap multiply-adds), 1x1 "per-image" (one matmul per image in its own layout) or, for
the input gradient of a dense stride-1 convolution, "flipped" (a forward convolution of g with the
weight transposed and flipped).
The choice comes from pock_mlir/tuning/<target>.json (the host's: this CPU's, see
pock_mlir.tuning.table_path; or the file of the tuning option, such as the table pock-tune measured
for this very program on its device): the nearest measured shape class,
timed by `python -m bench.iree_study convs` in the same forms; without measurements each op gets
its baseline form (forward: direct; gradients: im2col, depthwise patches). A convolution whose two
gradients are both used gets the pair of forms measured fastest together, from one producer of g,
where the table has such pairs: each form's layout of g costs in that producer.

The choice is visible in the IR, for pock-opt's users: the op doing the work carries
`pock.backend = "<form>"` and `pock.backend_reason = "<the measurements behind it>"`. Transposed
convolutions stay direct. A 1-D convolution (nn.Conv1d) takes its forms as a 2-D one of height 1:
IREE lowers a 1-D convolution without its im2col rewrite, several times slower.

Data tiling (IREE packs matmul operands into the CPU's register-tile layout), vector tails (how a
vectorized loop's remainder runs: masked, or peeled into a loop of its own) and fusion (IREE's
aggressive fusion forms fewer, larger dispatches) are flags of the whole IREE compilation, so their
choices mark the module: `pock.data_tiling = "data-tiled"` or `"plain"` (see choose_data_tiling),
`pock.vector_tails = "masked"`, `"peeled"` or `"target default"` (see choose_vector_tails) and
`pock.fusion = "aggressive"` or `"default"` (see choose_fusion), each with a `_reason`.

The pass returns every choice, typed, with the measurements it compared: a
pock_mlir.tuning.BackendChoices, which compile_training receives from the pipeline run and hands to
the TrainingProgram (its iree_flags() adds the flags chosen, backend_report() lists them).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from torch_mlir import ir

from pock_mlir.conv_forms import FORM_NAMES, FORMS, GRADIENT_INDEX, GRADIENTS, ConvShape, Window, needs_fitting
from pock_mlir.cost import op_flops
from pock_mlir.targets import TARGETS
from pock_mlir.torch_builder import TorchBuilder, decode_operand
from pock_mlir.torch_types import tensor_type_of
from pock_mlir.tuning import (
    MATMUL_TILE,
    BackendChoices,
    Choice,
    MatmulFlops,
    OpChoice,
    Tuning,
    WeightCopies,
    borrowed_driver_study,
    choose_conv_form,
    choose_data_tiling,
    choose_driver,
    choose_fusion,
    choose_vector_tails,
)

from .base import ModulePass, PassError, functions, option

# The ops that can carry a form's marks: the matmuls and sums doing the work, or the op itself.
WORK_OPS = (
    "torch.aten.mm",
    "torch.aten.bmm",
    "torch.aten.matmul",
    "torch.aten.sum.dim_IntList",
    "torch.aten.convolution",
    "torch.aten.convolution_backward",
)
CONVOLUTIONS = ("torch.aten.convolution", "torch.aten.convolution_backward")
MATMULS = ("torch.aten.mm", "torch.aten.bmm", "torch.aten.matmul")
SOFTMAXES = ("torch.aten._softmax", "torch.aten.softmax.int")
TRANSPOSED = Choice("direct", "transposed convolutions have only the direct form")


def conv_shape(op, x, w, output, stride, padding, dilation, transposed, groups) -> ConvShape | None:
    """The ConvShape of a 2-D convolution, or of a 1-D one as 2-D of height 1; None for a
    transposed one. PassError at `op` when its attributes, operands and output (the result, or g
    of a backward) do not fit together."""
    xt, wt, ot = tensor_type_of(x), tensor_type_of(w), tensor_type_of(output)
    if xt is None or wt is None or xt.rank not in (3, 4) or transposed:
        return None
    problem = None
    rank = xt.rank
    if wt.rank != rank or ot is None or ot.rank != rank or not len(stride) == len(padding) == len(dilation) == rank - 2:
        problem = "it is not a 1-D or 2-D convolution of tensors of one rank"
    elif min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
        problem = f"stride {stride} and dilation {dilation} must be positive, padding {padding} non-negative"
    elif xt.shape[1] % groups or wt.shape[0] % groups or wt.shape[1] * groups != xt.shape[1]:
        problem = f"input {list(xt.shape)} and weight {list(wt.shape)} do not fit {groups} group(s)"
    if problem is None:
        row = (1,) * (4 - rank)  # a 1-D convolution's height: one row, unpadded
        kernel, stride, dilation, size = ((*row, *v) for v in (wt.shape[2:], stride, dilation, xt.shape[2:]))
        padding = (*(0 for _ in row), *padding)
        shape = ConvShape(
            xt.shape[0], xt.shape[1], wt.shape[0], groups, Window.of(kernel, stride, padding, dilation, size)
        )
        if shape.output_shape() != (*ot.shape[:2], *row, *ot.shape[2:]):
            problem = f"it gives {list(shape.output_shape())}, not the declared {list(ot.shape)}"
    if problem:
        raise PassError(f"{op.name}: its operands and result do not fit each other: {problem}", op.location)
    return shape


def matmul_flops(ops) -> MatmulFlops:
    """The FLOPs of `ops`' convolutions and matmuls, and their softmaxes, that the per-program
    choices weigh."""
    ops = list(ops)
    matmuls = [(op_flops(op), op) for op in ops if op.name in MATMULS]

    def untiled(op) -> bool:
        lhs, rhs = (tensor_type_of(v).shape for v in op.operands[:2])
        return any(d % MATMUL_TILE for d in (*lhs[-2:], rhs[-1]))

    return MatmulFlops(
        convolutions=sum(op_flops(op) for op in ops if op.name in CONVOLUTIONS),
        matmuls=sum(f for f, _ in matmuls),
        largest_matmul=max((f for f, _ in matmuls), default=0),
        untiled_matmuls=sum(f for f, op in matmuls if untiled(op)),
        softmaxes=sum(op.name in SOFTMAXES for op in ops),
    )


def _bytes(value) -> int:
    t = tensor_type_of(value)
    return t.numel * t.itemsize


def weight_copies(ops) -> WeightCopies:
    """What data tiling would copy of the weights of one function's `ops`: its matmuls' operands
    computed from pock.param values alone (views, transposes, int4 unpackings), and the parameters
    they are computed from."""
    params_of, copied, read = {}, 0, set()
    for op in ops:
        if op.name == "pock.param":
            params_of[op.results[0]] = frozenset(op.operands)
            continue
        tensors = [v for v in op.operands if v in params_of or tensor_type_of(v) is not None]  # lists of them too
        if tensors and all(v in params_of for v in tensors):
            params_of.update((result, frozenset().union(*map(params_of.get, tensors))) for result in op.results)
        if op.name in MATMULS:
            for operand in (v for v in op.operands[:2] if v in params_of):
                copied += _bytes(operand)
                read |= params_of[operand]
    return WeightCopies(copied, sum(map(_bytes, read)))


def module_weight_copies(module: ir.Operation) -> WeightCopies:
    """weight_copies of the module's function that would copy the most, for its size."""
    return max(
        (weight_copies(op.operation for op in func.regions[0].blocks[0].operations) for func in functions(module)),
        key=lambda copies: copies.ratio,
        default=WeightCopies(0, 0),
    )


def module_matmul_flops(module: ir.Operation) -> MatmulFlops:
    """matmul_flops of every op of the module's functions, as the per-program choices see them
    (bench/iree_study.py records it for each program it measures)."""
    return matmul_flops(op.operation for func in functions(module) for op in func.regions[0].blocks[0].operations)


def _mark(op, choice: Choice, what: str, chosen: list) -> None:
    """Mark `op` with the choice for pock-opt's users, and add it to the function's `chosen`."""
    op.attributes["pock.backend"] = ir.StringAttr.get(choice.form)
    op.attributes["pock.backend_reason"] = ir.StringAttr.get(f"{what}: {choice.reason}")
    chosen.append(OpChoice(what, choice))


def _emit(op, choice: Choice, what: str, chosen: list, emitter, *operands):
    """Emit a form on `operands` before `op`, marking the op doing its work (its first matmul, sum
    or convolution; for a form made of elementwise ops, the one producing the result); returns the
    result. A 1-D convolution's operands get a height of 1, and its result loses it."""
    created = []
    b = TorchBuilder(ir.InsertionPoint(op), op.location, created)
    one_d = len(b.shape(operands[-1])) == 3
    result = emitter(b, *(b.aten.unsqueeze(v, 2) if one_d else v for v in operands))
    _mark(next((o for o in created if o.name in WORK_OPS), result.owner), choice, what, chosen)
    return b.aten.squeeze.dim(result, 2) if one_d else result


@dataclass(frozen=True)
class BackendSwitchPass(ModulePass):
    name = "pock-backend-switch"
    description = (
        "Give each convolution and each convolution gradient the form measured fastest on the target: "
        "direct, im2col + matmul, depthwise patches, 1x1 per-image matmuls or, for a stride-1 input "
        "gradient, a convolution with the flipped weight; marks the choice as "
        "pock.backend. Marks the module with whether IREE should data-tile its matmuls "
        "(pock.data_tiling), how it should vectorize loop remainders (pock.vector_tails) and fuse "
        "(pock.fusion), and with the driver a Trainer steps it on (pock.driver)"
    )
    target: str = option(
        "host",
        f"the target ({', '.join(TARGETS)}) whose tuning table to choose by: "
        "pock_mlir/tuning/<target>.json (the host's: this CPU's, pock_mlir.tuning.table_path)",
    )
    tuning: str = option(
        "",
        "a tuning table file to choose by instead of the target's, e.g. one measured on "
        "another machine (pock-tune and python -m bench.iree_study write them); a pock-tune table "
        "measured for another target, CPU or IREE runtime is refused",
    )
    tuning_any: bool = option(False, "use a pock-tune table measured for another target, CPU or IREE runtime")
    force: str = option("", f"use this form wherever it is implemented instead of choosing: {', '.join(FORM_NAMES)}")
    exclude: str = option(
        "",
        "a form never to choose (the fastest measured of the others instead), to measure what "
        f"it gains: {', '.join(FORM_NAMES)}",
    )
    min_speedup: float = option(
        1.25,
        "choose a form other than the baseline only if measured at least this much faster "
        "(timings on a shared machine vary by 10-20%)",
    )

    def apply(self, module: ir.Operation) -> BackendChoices:
        for name, form in (("force", self.force), ("exclude", self.exclude)):
            if form and form not in FORM_NAMES:
                raise PassError(f"{name} must be one of {', '.join(FORM_NAMES)}, got '{form}'")
        if not math.isfinite(self.min_speedup) or self.min_speedup < 1:
            raise PassError(f"min_speedup must be a finite number >= 1, got {self.min_speedup}")
        if self.target not in TARGETS:
            raise PassError(f"target must be one of {', '.join(TARGETS)}, got '{self.target}'")
        flops = module_matmul_flops(module)
        tiling = choose_data_tiling(self.measurements, flops, module_weight_copies(module))
        data_tiled = tiling.form == "data-tiled"
        tails = choose_vector_tails(self.measurements, flops, data_tiled)
        fusion = choose_fusion(self.measurements, flops, data_tiled, masked_tails=tails.form == "masked")
        # the host's tables are one per CPU: another CPU's driver study stands in where this one's has none
        borrowed = borrowed_driver_study() if self.target == "host" else None
        driver = choose_driver(self.measurements, flops, TARGETS[self.target].drivers, borrowed)
        for mark, choice in (
            ("pock.data_tiling", tiling),
            ("pock.vector_tails", tails),
            ("pock.fusion", fusion),
            ("pock.driver", driver),
        ):
            module.attributes[mark] = ir.StringAttr.get(choice.form)
            module.attributes[f"{mark}_reason"] = ir.StringAttr.get(choice.reason)
        chosen = {}
        for func in functions(module):
            ops = [op.operation for op in func.regions[0].blocks[0].operations]
            paired = self._paired_gradients([op for op in ops if op.name == "torch.aten.convolution_backward"])
            chosen_here = []
            for op in ops:
                if op.name == "torch.aten.convolution":
                    self._forward(op, chosen_here)
                elif op.name == "torch.aten.convolution_backward":
                    self._backward(op, paired, chosen_here)
            chosen[ir.StringAttr(func.attributes["sym_name"]).value] = tuple(chosen_here)
        return BackendChoices(tiling, tails, fusion, chosen, self.measurements.applied(flops), driver, flops)

    def _choose(self, shape: ConvShape, op: str) -> Choice:
        forms = shape.forms(op)
        if self.force:
            return Choice(self.force if self.force in forms else forms[0], f"forced by force={self.force}")
        return choose_conv_form(self.measurements, shape, op, self.min_speedup, self.exclude)

    def _paired_gradients(self, backwards: list) -> dict:
        """{gradient result: Choice} for each convolution whose two gradients are both used (by one
        convolution_backward, or by one each on the same g, x, w and window, as pock-autodiff emits
        them) where the table measured the pair: both forms chosen together (none when forced)."""
        if self.force:
            return {}
        convolutions = {}
        for op in backwards:
            g, x, w, _, stride, padding, dilation, transposed, _, groups, mask = map(decode_operand, op.operands)
            key = (g, x, w, tuple(stride), tuple(padding), tuple(dilation), transposed, groups)
            _, needed = convolutions.setdefault(key, (op, {}))
            needed.update(
                {
                    name: op.results[index]
                    for name, index in GRADIENT_INDEX.items()
                    if mask[index] and list(op.results[index].uses)
                }
            )
        paired = {}
        for (g, x, w, stride, padding, dilation, transposed, groups), (op, needed) in convolutions.items():
            if len(needed) < 2:
                continue
            shape = conv_shape(op, x, w, g, stride, padding, dilation, transposed, groups)
            if shape is None:
                continue
            pair = choose_conv_form(self.measurements, shape, GRADIENTS, self.min_speedup, self.exclude)
            if pair.measured:  # forms "<input form>+<weight form>"
                for name, form in zip(GRADIENT_INDEX, pair.form.split("+")):
                    paired[needed[name]] = Choice(form, f"both gradients {pair.reason}", pair.measured)
        return paired

    @functools.cached_property
    def measurements(self) -> Tuning:
        try:
            if self.tuning:
                return Tuning.from_file(self.tuning, self.target, self.tuning_any)
            return Tuning.of_target(self.target)
        except ValueError as e:
            raise PassError(str(e)) from None

    def _forward(self, op, chosen: list) -> None:
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = map(decode_operand, op.operands)
        shape = conv_shape(op, x, w, op.results[0], stride, padding, dilation, transposed, groups)
        if shape is None:
            _mark(op, TRANSPOSED, "convolution", chosen)
            return
        choice, what = self._choose(shape, "forward"), f"convolution {shape.kind()}"
        one_d = len(stride) == 1
        if choice.form == "direct" and not needs_fitting(shape) and not one_d:
            _mark(op, choice, what, chosen)
            return
        y = _emit(op, choice, what, chosen, lambda b, x, w: FORMS["forward", choice.form](b, shape, None, x, w), x, w)
        if bias is not None:
            b = TorchBuilder(ir.InsertionPoint(op), op.location)
            y = b.add(y, b.reshape(bias, [1, shape.o] + [1] * (2 - one_d)))
        op.results[0].replace_all_uses_with(y)
        op.erase()

    def _backward(self, op, paired: dict, chosen: list) -> None:
        """Each gradient the op computes and something uses gets its own form: the one chosen with
        the other gradient's (`paired`), else its own."""
        g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask = map(
            decode_operand, op.operands
        )
        shape = conv_shape(op, x, w, g, stride, padding, dilation, transposed, groups)
        if shape is None:
            _mark(op, TRANSPOSED, "convolution_backward", chosen)
            return
        for name, index in GRADIENT_INDEX.items():
            if mask[index] and list(op.results[index].uses):
                choice = paired.get(op.results[index]) or self._choose(shape, name)
                value = _emit(
                    op,
                    choice,
                    f"{name} {shape.kind()}",
                    chosen,
                    lambda b, g, x, w, name=name, choice=choice: FORMS[name, choice.form](b, shape, g, x, w),
                    g,
                    x,
                    w,
                )
                op.results[index].replace_all_uses_with(value)
        if mask[2] and list(op.results[2].uses):
            spatial = list(range(2, 2 + len(stride)))
            op.results[2].replace_all_uses_with(TorchBuilder(ir.InsertionPoint(op), op.location).sum(g, [0, *spatial]))
        op.erase()
