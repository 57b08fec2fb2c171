"""Reproducible dropout in compiled training steps: a counter-based hash replaces torch's RNG.

A compiled step has no random-number state, and its masks must be reproducible, so the frontend
traces the model inside `SeededDropout(seed)`, where `seed` is an int32 scalar input of the step.
Dropout (`F.dropout` and `nn.Dropout`, `F.dropout1d/2d/3d`, `torch.dropout`, the dropout_p of
`scaled_dot_product_attention`, and through these nn.MultiheadAttention's and
nn.TransformerEncoderLayer's) and stochastic depth (`Tensor.bernoulli_(p)` on a fresh tensor, as
torchvision's StochasticDepth and timm's DropPath draw their masks) then keep element `index` of a
mask when

    bits = h(h(index + key) ^ key),   key = h(h(seed) + call)
    keep = (bits >>> 8) >= round(p * 2**24)

where h is Wellons' lowbias32 integer hash, `call` numbers the dropout calls of one forward pass
(0, 1, ...) and `index` is the element's flat index in the mask. The 24 top bits are uniform, so
an element is kept with probability 1 - p (to 2**-24), and kept elements are scaled by
1 / (1 - p), as in torch. Everything is int32 arithmetic that wraps around, which torch on the
host and IREE on the device compute bit for bit alike: running the model eagerly inside
`SeededDropout` with the same seed reproduces the compiled step's masks (the tests' oracle does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical shift of int32 values (torch's >> on int32 is arithmetic)."""
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def _hash(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons), on int32 with wrap-around multiplication."""
    x = x ^ _shift_right(x, 16)
    x = x * 0x7FEB352D
    x = x ^ _shift_right(x, 15)
    x = x * (0x846CA68B - (1 << 32))  # the constant as a signed int32
    return x ^ _shift_right(x, 16)


def keep_mask(seed: torch.Tensor, call: int, shape, p: float) -> torch.Tensor:
    """Which elements dropout call number `call` keeps (bool, `shape`), for an int32 scalar seed."""
    key = _hash(_hash(seed) + call)
    index = torch.arange(math.prod(shape), dtype=torch.int32).view(shape)
    bits = _hash(_hash(index + key) ^ key)
    return _shift_right(bits, 8) >= round(p * (1 << 24))


class SeededDropout:
    """While active, dropout draws its masks from `keep_mask(seed, ...)`; `calls` counts the
    dropout calls that drew a mask (training mode and 0 < p).

    It swaps the seeded versions in for `torch.nn.functional.dropout`, `dropout1d/2d/3d`,
    `scaled_dot_product_attention`, `torch.dropout` and `torch.Tensor.bernoulli_` and restores them
    on exit. Replacing the
    module attributes (rather than a TorchFunctionMode, which does not see the calls made inside
    another intercepted function) also reaches the dropout inside nn.MultiheadAttention, which
    calls these through torch.nn.functional's globals. A reference bound before entry (`from
    torch.nn.functional import dropout`) keeps torch's RNG; the frontend then reports the op.
    """

    def __init__(self, seed: torch.Tensor):
        self.seed, self.calls = seed, 0
        self._originals: dict[tuple[object, str], object] = {}

    def __enter__(self) -> SeededDropout:
        attention = F.scaled_dot_product_attention
        seeded = {
            (F, "dropout"): lambda input, p=0.5, training=True, inplace=False: self.dropout(input, p, training, 0),
            (F, "dropout1d"): lambda input, p=0.5, training=True, inplace=False: self.dropout(input, p, training, 1),
            (F, "dropout2d"): lambda input, p=0.5, training=True, inplace=False: self.dropout(input, p, training, 2),
            (F, "dropout3d"): lambda input, p=0.5, training=True, inplace=False: self.dropout(input, p, training, 3),
            (torch, "dropout"): lambda input, p, train: self.dropout(input, p, train, 0),
            (F, "scaled_dot_product_attention"): lambda *args, **kwargs: self.attention(attention, *args, **kwargs),
        }
        bernoulli_ = torch.Tensor.bernoulli_
        seeded[torch.Tensor, "bernoulli_"] = lambda x, p=0.5, *, generator=None: (
            bernoulli_(x, p, generator=generator) if isinstance(p, torch.Tensor) else self.bernoulli_(x, p)
        )
        for (module, name), replacement in seeded.items():
            self._originals[module, name] = module.__dict__.get(name)  # None: inherited (Tensor's from its C base)
            setattr(module, name, replacement)
        return self

    def __exit__(self, *exc_info) -> None:
        for (module, name), original in self._originals.items():
            if original is None:
                delattr(module, name)
            else:
                setattr(module, name, original)
        self._originals.clear()

    def bernoulli_(self, x: torch.Tensor, p: float) -> torch.Tensor:
        """x filled with ones with probability p, else zeros, from this scheme's next mask: stochastic
        depth's per-sample masks (a tensor of probabilities is left to torch, whose op the frontend
        then reports)."""
        keep = keep_mask(self.seed, self.calls, tuple(x.shape), 1.0 - p)
        self.calls += 1
        return x.copy_(keep.to(x.dtype))

    def dropout(self, x: torch.Tensor, p: float, training: bool, spatial_dims: int) -> torch.Tensor:
        """Element dropout, or with `spatial_dims` > 0 channel dropout: one mask entry for all the
        trailing spatial positions of a (sample, channel)."""
        if not training or p == 0:
            return x
        if p == 1:
            return x * 0
        shape = tuple(x.shape[: x.dim() - spatial_dims]) + (1,) * spatial_dims
        keep = keep_mask(self.seed, self.calls, shape, p)
        self.calls += 1
        return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))

    def attention(
        self, attention, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        """torch's scaled_dot_product_attention; with dropout, its reference maths with this
        dropout on the attention weights."""
        if dropout_p == 0:
            return attention(
                query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
            )
        if enable_gqa:
            group = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        scores = query @ key.transpose(-2, -1) * scale
        if is_causal:
            causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            scores = (
                scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
            )
        return self.dropout(scores.softmax(-1), dropout_p, True, 0) @ value
