"""The layers whose weights LoRA adapts and int8 stores: what kind each is, by its weight layout."""

from __future__ import annotations

KINDS = ("linear", "conv1d", "conv")  # nn.Linear [out, in]; Hugging Face Conv1D [in, out]; nn.Conv2d [out, in/g, kh, kw]


def kind_of(module) -> str | None:
    """The kind of a PyTorch module, None for a module of none of them."""
    import torch.nn as nn

    if isinstance(module, nn.Linear):
        return "linear"
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None and module.weight.dim() == 2:
        return "conv1d"  # GPT-2's linear: y = x @ W + b
    if isinstance(module, nn.Conv2d) and module.padding_mode == "zeros":
        return "conv"
    return None
