"""Reproducible dropout in compiled training steps: a counter-based hash replaces torch's RNG.

A compiled step has no random-number state, and its masks must be reproducible, so the frontend
traces the model inside `SeededDropout(seed)`, where `seed` is an int32 scalar input of the step.
Dropout (`F.dropout` and `nn.Dropout`, `F.dropout1d/2d/3d`, `torch.dropout`, and the dropout_p
of `scaled_dot_product_attention`) then keeps element `index` of its mask when

    bits = h(h(index + key) ^ key),   key = h(h(seed) + call)
    keep = (bits >>> 8) >= round(p * 2**24)

where h is Wellons' lowbias32 integer hash, `call` numbers the dropout calls of one forward pass
(0, 1, ...) and `index` is the element's flat index in the mask. The 24 top bits are uniform, so
an element is kept with probability 1 - p (to 2**-24), and kept elements are scaled by
1 / (1 - p), as in torch. Everything is int32 arithmetic that wraps around, which torch on the
host and IREE on the device compute bit for bit alike: running the model eagerly under the same
mode and seed reproduces the compiled step's masks (the tests' oracle does exactly that).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode



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


def _bind(names, args, kwargs, defaults) -> dict:
    """A call's arguments by name."""
    return {**defaults, **dict(zip(names, args)), **kwargs}


# Channel dropout: how many trailing spatial dims share one mask entry.
_SPATIAL_DIMS = {F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}
_ATTENTION_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}


class SeededDropout(TorchFunctionMode):
    """Within this mode, dropout draws its masks from `keep_mask(seed, ...)`; `calls` counts
    the dropout calls that drew a mask (training mode and 0 < p)."""

    def __init__(self, seed: torch.Tensor):
        super().__init__()
        self.seed, self.calls = seed, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout or func in _SPATIAL_DIMS:
            a = _bind(("input", "p", "training", "inplace"), args, kwargs, {"p": 0.5, "training": True})
            return self.dropout(a["input"], a["p"], a["training"], _SPATIAL_DIMS.get(func, 0))
        if func is torch.dropout:
            a = _bind(("input", "p", "train"), args, kwargs, {})
            return self.dropout(a["input"], a["p"], a["train"], 0)
        if func is F.scaled_dot_product_attention:
            a = _bind(("query", "key", "value", *_ATTENTION_DEFAULTS), args, kwargs, _ATTENTION_DEFAULTS)
            if a["dropout_p"] > 0:
                return self.attention_with_dropout(**a)
        return func(*args, **kwargs)

    def dropout(self, x: torch.Tensor, p: float, training: bool, spatial_dims: int) -> torch.Tensor:
        if not training or p == 0:
            return x
        if p == 1:
            return x * 0
        shape = tuple(x.shape[:x.dim() - spatial_dims]) + (1,) * spatial_dims
        keep = keep_mask(self.seed, self.calls, shape, p)
        self.calls += 1
        return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))

    def attention_with_dropout(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """scaled_dot_product_attention's reference maths, with this mode's dropout on the weights."""
        if enable_gqa:
            group = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        scores = query @ key.transpose(-2, -1) * scale
        if is_causal:
            causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
        return self.dropout(scores.softmax(-1), dropout_p, True, 0) @ value
