"""Every form a 2-D convolution can take, forward and backward, each written once against the
TorchBuilder: pock-backend-switch emits them, and bench/iree_study.py compiles and times the very
same IR (`FORMS`), so the form measured is the form emitted.

The derivative rule of aten.convolution emits only the abstract backward, one
aten.convolution_backward per gradient; pock-backend-switch replaces each by a form chosen from
the measurements in pock_mlir/tuning/<target>.json. The forms:

- "direct": the op itself, aten.convolution or aten.convolution_backward, which torch-mlir and
  IREE lower as convolutions (the backward's input gradient as a transposed convolution).
- "im2col": the input's windows unfolded (aten.unfold per spatial dim, one IREE dispatch) and one
  matmul per group over every image and position. The forward multiplies the weight with the
  windows; the weight gradient is g times the windows (a batch-grouped convolution of the input
  with g as its kernel compiled to a direct convolution 15-50x slower on ResNet-18 layers, and a
  matmul per image materialised N weight-sized products); the input gradient is g W to columns
  (the weight as stored: transposing or flipping it costs a weight-sized copy per step) folded
  back with col2im, by stride phase with slices instead of scatters (a transposed convolution
  ran 2-10x slower strided and does not compile grouped).
- "patches", depthwise only: per kernel tap, a shifted window times that tap's weight. The
  forward accumulates the taps (one fused elementwise dispatch); the weight gradient multiplies
  and sums over images and positions (torch's batch-grouped form was the slowest MobileNetV2
  dispatch); the input gradient folds g times each tap's weight back (no k*k times larger
  columns tensor). IREE 3.13 fuses the weight gradient into one conv-like generic, reading the
  input at h + kh, which its CPU backend runs as scalar loops (the slowest dispatches of a
  MobileNetV2's full step in bench/results.md's profile). One vectorized reduction per tap, of
  that tap's window, cost a dispatch each and was no faster over a whole step; channels
  innermost, IREE's transpose propagation folds the layout back.
- "per-image", 1x1 stride-1 unpadded only: each image's [C, H*W] map is a matrix the weight
  multiplies as it is laid out (forward W x_n, input gradient W^T g_n, weight gradient the sum
  over images of g_n x_n^T). im2col's rows of positions by channels transposed the activations in
  and out of each gradient's matmul, which is most of the work where the maps are large and the
  weight small (MobileNetV2's early expand and project convolutions); with a large weight the
  per-image weight-sized products of the weight gradient cost more.
- "flipped", the input gradient of a dense stride-1 convolution only: the forward convolution of g
  with the weight transposed and flipped, padded by the kernel's reach less the forward's padding,
  which IREE compiles as it does a forward (its own im2col and one matmul, no columns tensor
  folded back). im2col's g W wrote the columns out, kh*kw times the input, and col2im read them
  back; flipping the weight costs a weight-sized copy per step, too much with a large weight on
  small maps. A strided convolution would need g with zeros inserted.

Each op's first form in `ConvShape.forms` is its baseline: what is emitted unless another form
measured faster by the pass's margin, and without measurements.

A step computes both gradients of a convolution from one g, which an elementwise op (the
activation's or batch norm's backward) produces: IREE fuses each form's layout change of g into
that producer, so what one gradient's form costs depends on the other's. The pair is measured
too, as "gradients" with forms "<input form>+<weight form>" from one producer: measured alone,
a gradient whose form transposes g pays for the transposed read inside its matmul, not for the
producer writing g twice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

CONV_OPS = ("forward", "weight_grad", "input_grad")
GRADIENT_INDEX = {"input_grad": 0, "weight_grad": 1}  # in convolution_backward's results
GRADIENTS = "gradients"  # both gradients, forms "<input form>+<weight form>"


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window over [N, C, H, W]: per spatial dim its kernel size, stride, padding
    and dilation, and the input and output sizes."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    in_size: tuple[int, int]
    out_size: tuple[int, int]

    @classmethod
    def of(cls, kernel, stride, padding, dilation, in_size) -> Window:
        """The window with the output size a convolution or pooling without ceil_mode gives."""
        out = tuple(
            (i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(in_size, kernel, stride, padding, dilation)
        )
        return cls(*(tuple(v) for v in (kernel, stride, padding, dilation, in_size)), out)

    @property
    def read_extent(self) -> tuple[int, int]:
        """Per spatial dim, how many rows of the padded input the windows read, from the first on."""
        return tuple(
            d * (k - 1) + s * (o - 1) + 1 for d, k, s, o in zip(self.dilation, self.kernel, self.stride, self.out_size)
        )

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """The kernel positions (i, j), row-major: the order of weight[..., i, j]."""
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution (not transposed): batch, input and output channels, groups, window."""

    n: int
    c: int
    o: int
    groups: int
    window: Window

    @classmethod
    def from_json(cls, fields: dict) -> ConvShape:
        window = Window(**{k: tuple(v) for k, v in fields["window"].items()})
        return cls(fields["n"], fields["c"], fields["o"], fields["groups"], window)

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group (MobileNet's depthwise convs)."""
        return self.groups > 1 and self.groups == self.c == self.o

    @property
    def pointwise(self) -> bool:
        w = self.window
        return w.kernel == (1, 1) and w.stride == (1, 1) and w.padding == (0, 0)

    @property
    def flippable(self) -> bool:
        """Dense, stride 1, not pointwise (per-image is its own form there), its padding within the
        kernel's reach: the input gradient is then a convolution of g without padding to remove."""
        w = self.window
        return (
            self.groups == 1
            and w.stride == (1, 1)
            and not self.pointwise
            and all(p <= d * (k - 1) for p, d, k in zip(w.padding, w.dilation, w.kernel))
        )

    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.o, *self.window.out_size)

    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.o, self.c // self.groups, *self.window.kernel)

    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, *self.window.in_size)

    def kind(self) -> str:
        family = "depthwise" if self.depthwise else "grouped" if self.groups > 1 else "dense"
        w = self.window

        def pair(p):
            return str(p[0]) if p[0] == p[1] else f"{p[0]}x{p[1]}"

        dilation = f" d{pair(w.dilation)}" if w.dilation != (1, 1) else ""
        return (
            f"{family} {w.kernel[0]}x{w.kernel[1]}/s{pair(w.stride)}{dilation} {self.c}->{self.o} "
            f"{w.in_size[0]}x{w.in_size[1]} n{self.n}"
        )

    def macs(self) -> int:
        return math.prod(self.output_shape()) * (self.c // self.groups) * math.prod(self.window.kernel)

    def forms(self, op: str) -> tuple[str, ...]:
        """The forms implemented for this shape and op (or both gradients' pairs), its baseline
        first. Grouped convolutions that are not depthwise have their im2col gradients only
        (direct ones are unmeasured)."""
        if op == GRADIENTS:  # the baseline pair first
            return tuple(f"{i}+{w}" for i in self.forms("input_grad") for w in self.forms("weight_grad"))
        if self.depthwise:
            return ("direct", "patches") if op == "forward" else ("patches", "direct")
        if self.groups > 1:
            return ("direct",) if op == "forward" else ("im2col",)
        per_image = ("per-image",) if self.pointwise else ()
        if op == "forward":
            return ("direct", "im2col", *per_image)
        flipped = ("flipped",) if op == "input_grad" and self.flippable else ()
        return ("im2col", "direct", *flipped, *per_image)


# -- im2col and col2im ------------------------------------------------------------------------


def pad_spatial(b, x, top, bottom, left, right):
    """x [..., H, W] with zero rows and columns added on each side, or, for a negative amount,
    that many removed (by slicing: IREE rejects constant_pad_nd's negative pads)."""
    for dim, before, after in ((-2, top, bottom), (-1, left, right)):
        if before < 0 or after < 0:
            size = b.shape(x)[dim]
            x = b.aten.slice.Tensor(x, dim, max(-before, 0), size - max(-after, 0), 1)
    pads = [max(left, 0), max(right, 0), max(top, 0), max(bottom, 0)]
    return b.aten.constant_pad_nd(x, pads, 0.0) if any(pads) else x


def unfold(b, x, window: Window):
    """im2col: [N, C, Ho, Wo, kh, kw], the zero-padded input values each output position
    multiplies with weight[..., i, j]. aten.unfold per spatial dim lowers to a single IREE
    dispatch (one strided slice per offset took one dispatch each)."""
    if window.kernel == (1, 1) and window.padding == (0, 0) and window.stride == (1, 1):
        return b.aten.unsqueeze(b.aten.unsqueeze(x, 4), 5)
    x = pad_spatial(b, x, window.padding[0], window.padding[0], window.padding[1], window.padding[1])
    for dim, k, s, d in zip((2, 3), window.kernel, window.stride, window.dilation):
        span = d * (k - 1) + 1
        if k == 1:  # a strided slice: IREE 3.13 computed unfold(size 1, step 2) wrongly in ResNet's evaluate
            x = b.aten.unsqueeze(b.aten.slice.Tensor(x, dim, 0, b.shape(x)[dim], s), -1)
            continue
        x = b.aten.unfold(x, dim, span, s)
        if d > 1:
            x = b.aten.slice.Tensor(x, -1, 0, span, d)
    return x


def fold(b, cols, window: Window, tap_weights=None):
    """col2im, the transpose of `unfold`: cols [N, C, kh*kw, Ho, Wo] summed into the input
    positions each offset was read from. With tap_weights [C, kh*kw], cols is one [N, C, Ho, Wo]
    map that every offset reads, times that offset's per-channel weight (the depthwise input
    gradient).

    Padded row i*d + s*t is row (i*d)//s + t of phase (i*d)%s once the rows are split into s
    interleaved phases, so each phase is a sum of shifted slices of cols, padded once (no
    scatter, no zero-inserted tensors); one stack and reshape interleave the phases back."""
    n, c = b.shape(cols)[:2]
    (sh, sw), (ph, pw), (dh, dw) = window.stride, window.padding, window.dilation
    (h, w), (ho, wo), (kh, kw) = window.in_size, window.out_size, window.kernel
    # Blocks per phase: enough for the padded input and for every window (ceil_mode pooling
    # windows may run past the padding; what lands there is cropped away).
    hb, wb = (
        -(-max(size + 2 * p, read) // s) for size, p, read, s in zip((h, w), (ph, pw), window.read_extent, (sh, sw))
    )
    top, left = dh * (kh - 1) // sh, dw * (kw - 1) // sw  # the largest block shifts
    padded = pad_spatial(b, cols, top, hb - ho, left, wb - wo)
    phases = {}
    for o, (i, j) in enumerate(window.offsets):
        (bi, a), (bj, e) = divmod(i * dh, sh), divmod(j * dw, sw)
        tap = padded if tap_weights is not None else b.aten.select.int(padded, 2, o)
        rows = b.aten.slice.Tensor(tap, 2, top - bi, top - bi + hb, 1)
        placed = b.aten.slice.Tensor(rows, 3, left - bj, left - bj + wb, 1)
        if tap_weights is not None:
            placed = b.mul(placed, b.reshape(b.aten.select.int(tap_weights, 1, o), [1, c, 1, 1]))
        phases[a, e] = b.add(phases[a, e], placed) if (a, e) in phases else placed
    if (sh, sw) == (1, 1):
        interleaved = phases[0, 0]
    else:
        zeros = b.full([n, c, hb, wb], 0.0, b.type_of(cols).dtype)
        rows = [b.aten.stack([phases.get((a, e), zeros) for e in range(sw)], 4) for a in range(sh)]
        interleaved = b.reshape(b.aten.stack(rows, 3), [n, c, hb * sh, wb * sw])
    if b.shape(interleaved)[2:] != (h, w):
        interleaved = b.aten.slice.Tensor(b.aten.slice.Tensor(interleaved, 2, ph, ph + h, 1), 3, pw, pw + w, 1)
    return interleaved


def tap_windows(b, x, window: Window):
    """[(i, j, window [N, C, Ho, Wo])] for every kernel tap: unit-stride slices of the padded
    input. With stride s the padded rows and columns are first split into s phases, so a
    strided window is a contiguous slice of one phase: IREE vectorizes those, while strided
    slices of the innermost dim ran 2-3x slower."""
    n, c = b.shape(x)[:2]
    (sh, sw), (ph, pw), (dh, dw) = window.stride, window.padding, window.dilation
    (h, w), (ho, wo) = window.in_size, window.out_size
    hb, wb = (-(-read // s) for read, s in zip(window.read_extent, (sh, sw)))
    padded = pad_spatial(b, x, ph, hb * sh - h - ph, pw, wb * sw - w - pw)  # cropped where no window reads
    if (sh, sw) != (1, 1):
        padded = b.aten.permute(b.reshape(padded, [n, c, hb, sh, wb, sw]), [0, 1, 3, 5, 2, 4])
    windows = []
    for i, j in window.offsets:
        (bi, a), (bj, e) = divmod(i * dh, sh), divmod(j * dw, sw)
        phase = padded if (sh, sw) == (1, 1) else b.aten.select.int(b.aten.select.int(padded, 2, a), 2, e)
        rows = b.aten.slice.Tensor(phase, 2, bi, bi + ho, 1)
        windows.append((i, j, b.aten.slice.Tensor(rows, 3, bj, bj + wo, 1)))
    return windows


def positions_by_group(b, value, groups: int):
    """[N, G*k, Ho, Wo] as [G, N*Ho*Wo, k]: per group, one row per image position."""
    n, channels, ho, wo = b.shape(value)
    rows = b.reshape(b.aten.permute(value, [0, 2, 3, 1]), [n * ho * wo, groups, channels // groups])
    return b.aten.permute(rows, [1, 0, 2])


def columns_by_group(b, x, s: ConvShape):
    """The unfolded input as [G, N*Ho*Wo, C/G*kh*kw]: per group, one row of window values per
    image position, in the weight's (c, i, j) order."""
    patches = unfold(b, x, s.window)  # [N, C, Ho, Wo, kh, kw]
    n, c, ho, wo, kh, kw = b.shape(patches)
    cols = b.reshape(b.aten.permute(patches, [0, 2, 3, 1, 4, 5]), [n * ho * wo, s.groups, c // s.groups * kh * kw])
    return b.aten.permute(cols, [1, 0, 2])


# -- the forms: (b, shape, g, x, w) -> the op's result; g is None for the forward ---------------


def _backward(b, s: ConvShape, g, x, w, op: str):
    w_ = s.window
    mask = [op == "input_grad", op == "weight_grad", False]
    results = b.aten.convolution_backward(
        g, x, w, None, list(w_.stride), list(w_.padding), list(w_.dilation), False, [0, 0], s.groups, mask
    )
    return results[GRADIENT_INDEX[op]]


def forward_direct(b, s: ConvShape, g, x, w):
    w_ = s.window
    return b.aten.convolution(x, w, None, list(w_.stride), list(w_.padding), list(w_.dilation), False, [0, 0], s.groups)


def forward_im2col(b, s: ConvShape, g, x, w):
    """y = W [O, C*kh*kw] @ columns [C*kh*kw, N*Ho*Wo], back to [N, O, Ho, Wo]."""
    n, o, ho, wo = s.output_shape()
    taps = s.c * math.prod(s.window.kernel)
    cols = b.reshape(b.aten.permute(unfold(b, x, s.window), [1, 4, 5, 0, 2, 3]), [taps, n * ho * wo])
    y = b.aten.mm(b.reshape(w, [o, taps]), cols)
    return b.aten.permute(b.reshape(y, [o, n, ho, wo]), [1, 0, 2, 3])


def forward_patches(b, s: ConvShape, g, x, w):
    """Depthwise y = sum over taps of window * w[c, tap], accumulated tap by tap (one fused
    elementwise dispatch; stacking the k*k windows and reducing them ran 3x slower)."""
    total = None
    for i, j, window in tap_windows(b, x, s.window):
        tap = b.reshape(b.aten.select.int(b.aten.select.int(w, 2, i), 2, j), [1, s.c, 1, 1])
        term = b.mul(window, tap)
        total = term if total is None else b.add(total, term)
    return total


def weight_grad_im2col(b, s: ConvShape, g, x, w):
    """dW[o, c, i, j] = sum over images and positions of g[n, o] x_padded[n, c, offset (i, j)]:
    one matmul per group contracting images and positions together."""
    n, o, ho, wo = s.output_shape()
    g_t = b.aten.permute(b.reshape(g, [n, s.groups, o // s.groups, ho * wo]), [1, 2, 0, 3])  # [G, O/G, N, Ho*Wo]
    g_t = b.reshape(g_t, [s.groups, o // s.groups, n * ho * wo])
    return b.reshape(b.aten.bmm(g_t, columns_by_group(b, x, s)), s.weight_shape())


def weight_grad_patches(b, s: ConvShape, g, x, w):
    """Depthwise dW[c, i, j] = sum over images and positions of window(i, j) * g: one fused
    multiply-reduce."""
    n, o, ho, wo = s.output_shape()
    per_channel = b.aten.permute(unfold(b, x, s.window), [1, 4, 5, 0, 2, 3])  # [C, kh, kw, N, Ho, Wo]
    g_per_channel = b.reshape(b.aten.permute(g, [1, 0, 2, 3]), [o, 1, 1, n, ho, wo])
    return b.reshape(b.sum(b.mul(per_channel, g_per_channel), [3, 4, 5]), s.weight_shape())


def input_grad_im2col(b, s: ConvShape, g, x, w):
    """dX = col2im(g W), the weight used as stored."""
    n, o, ho, wo = s.output_shape()
    _, cin_per_group, kh, kw = s.weight_shape()
    w_rows = b.reshape(w, [s.groups, o // s.groups, cin_per_group * kh * kw])
    cols = b.aten.bmm(positions_by_group(b, g, s.groups), w_rows)  # [G, N*Ho*Wo, Cin/G*kh*kw]
    cols = b.reshape(cols, [s.groups, n, ho, wo, cin_per_group, kh * kw])
    cols = b.reshape(b.aten.permute(cols, [1, 0, 4, 5, 2, 3]), [n, s.c, kh * kw, ho, wo])
    return fold(b, cols, s.window)


def input_grad_flipped(b, s: ConvShape, g, x, w):
    """Stride 1: dX = g convolved with the weight as [C, O, kh, kw], each kernel flipped, padded by
    d*(k-1) - p."""
    w_ = s.window
    flipped = b.aten.flip(b.aten.permute(w, [1, 0, 2, 3]), [2, 3])
    padding = [d * (k - 1) - p for k, p, d in zip(w_.kernel, w_.padding, w_.dilation)]
    return b.aten.convolution(g, flipped, None, [1, 1], padding, list(w_.dilation), False, [0, 0], 1)


def input_grad_patches(b, s: ConvShape, g, x, w):
    """Depthwise dX: g times each tap's weight, folded back onto the positions the tap read."""
    return fold(b, g, s.window, tap_weights=b.reshape(w, [s.o, math.prod(s.window.kernel)]))


def _matrices(b, value):
    """[N, K, H, W] as N matrices [K, H*W]."""
    n, k, h, w = b.shape(value)
    return b.reshape(value, [n, k, h * w])


def forward_per_image(b, s: ConvShape, g, x, w):
    """Pointwise y_n = W [O, C] @ x_n [C, H*W]."""
    return b.reshape(b.aten.matmul(b.reshape(w, [s.o, s.c]), _matrices(b, x)), s.output_shape())


def weight_grad_per_image(b, s: ConvShape, g, x, w):
    """Pointwise dW = sum over images of g_n [O, H*W] @ x_n^T [H*W, C]."""
    per_image = b.aten.bmm(_matrices(b, g), b.transpose(_matrices(b, x), 1, 2))
    return b.reshape(b.sum(per_image, [0]), s.weight_shape())


def input_grad_per_image(b, s: ConvShape, g, x, w):
    """Pointwise dx_n = W^T [C, O] @ g_n [O, H*W] (the transposed weight: a weight-sized copy)."""
    w_t = b.transpose(b.reshape(w, [s.o, s.c]), 0, 1)
    return b.reshape(b.aten.matmul(w_t, _matrices(b, g)), s.input_shape())


def needs_fitting(s: ConvShape) -> bool:
    """IREE 3.13 fails to compile ("inferred ... dimension to be 4, but found 3") a strided
    convolution with a single output row whose padded input has rows no window reads (torchvision's
    MobileNetV2 at 32 px: a 3x3/s2 conv of a 2x2 map), in every form that pads inside."""
    w = s.window
    return any(o == 1 and read < i + 2 * p for o, read, i, p in zip(w.out_size, w.read_extent, w.in_size, w.padding))


def _fitted(form, op: str):
    """`form` on the input padded to exactly the rows the windows read (and cropped where they read
    fewer), with no padding of its own; the input gradient is mapped back to the input's rows."""

    def emit(b, s: ConvShape, g, x, w):
        if not needs_fitting(s):
            return form(b, s, g, x, w)
        w_ = s.window
        (ph, pw), (eh, ew) = w_.padding, w_.read_extent
        after_h, after_w = eh - ph - w_.in_size[0], ew - pw - w_.in_size[1]  # < 0: input rows unread
        fitted = ConvShape(s.n, s.c, s.o, s.groups, Window.of(w_.kernel, w_.stride, (0, 0), w_.dilation, (eh, ew)))
        result = form(b, fitted, g, pad_spatial(b, x, ph, after_h, pw, after_w), w)
        return pad_spatial(b, result, -ph, -after_h, -pw, -after_w) if op == "input_grad" else result  # its inverse

    return emit


FORMS = {
    ("forward", "direct"): forward_direct,
    ("forward", "im2col"): forward_im2col,
    ("forward", "patches"): forward_patches,
    ("forward", "per-image"): forward_per_image,
    ("weight_grad", "direct"): lambda b, s, g, x, w: _backward(b, s, g, x, w, "weight_grad"),
    ("weight_grad", "im2col"): weight_grad_im2col,
    ("weight_grad", "patches"): weight_grad_patches,
    ("weight_grad", "per-image"): weight_grad_per_image,
    ("input_grad", "direct"): lambda b, s, g, x, w: _backward(b, s, g, x, w, "input_grad"),
    ("input_grad", "im2col"): input_grad_im2col,
    ("input_grad", "patches"): input_grad_patches,
    ("input_grad", "per-image"): input_grad_per_image,
    ("input_grad", "flipped"): input_grad_flipped,
}
FORMS = {(op, form): _fitted(emit, op) for (op, form), emit in FORMS.items()}
FORM_NAMES = ("direct", "im2col", "patches", "per-image", "flipped")


def convolution_gradient(b, op: str, g, x, w, stride, padding, dilation, groups):
    """The abstract backward of a 2-D convolution: one aten.convolution_backward computing only
    `op`'s gradient, which pock-backend-switch gives a measured form."""
    n, c = b.shape(x)[:2]
    s = ConvShape(n, c, b.shape(w)[0], groups, Window.of(b.shape(w)[2:], stride, padding, dilation, b.shape(x)[2:]))
    return _backward(b, s, g, x, w, op)
