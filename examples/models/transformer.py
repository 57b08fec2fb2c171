"""Small transformer models built from stock PyTorch pieces, for tests, benchmarks and examples.

`BertLike` is a BERT/DistilBERT-style encoder classifier (token and position embeddings with a
padding index, post-LayerNorm blocks, GELU feed-forward, scaled_dot_product_attention with a
key-padding mask, a classifier on the first token). `LlamaLike` is a LLaMA-style decoder
(RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention, a causal mask, the
output projection tied to the token embedding). Sizes are configurable; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class BertConfig:
    vocab: int = 64
    max_len: int = 16
    dim: int = 32
    heads: int = 4
    layers: int = 2
    hidden: int = 64
    classes: int = 3
    dropout: float = 0.0
    pad_id: int = 0
    gelu: str = "none"  # torch's `approximate`: none (erf) or tanh


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads, self.dropout = cfg.heads, cfg.dropout
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x, keep):  # keep: (B, 1, 1, T) bool, False at padding keys
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out(attended.transpose(1, 2).reshape(b, t, d))


class BertBlock(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.ffn = nn.Sequential(
            nn.Linear(cfg.dim, cfg.hidden), nn.GELU(approximate=cfg.gelu), nn.Linear(cfg.hidden, cfg.dim)
        )
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, keep):
        x = self.norm1(x + self.drop(self.attention(x, keep)))
        return self.norm2(x + self.drop(self.ffn(x)))


class BertLike(nn.Module):
    """Token ids (B, T), padding = cfg.pad_id -> class logits (B, classes)."""

    def __init__(self, cfg: BertConfig = BertConfig()):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.dim, padding_idx=cfg.pad_id)
        self.positions = nn.Embedding(cfg.max_len, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(BertBlock(cfg) for _ in range(cfg.layers))
        self.classifier = nn.Linear(cfg.dim, cfg.classes)

    def forward(self, ids):
        t = ids.shape[1]
        keep = (ids != self.cfg.pad_id)[:, None, None, :]
        x = self.drop(self.norm(self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))))
        for block in self.blocks:
            x = block(x, keep)
        return self.classifier(x[:, 0])


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 64
    max_len: int = 16
    dim: int = 32
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    hidden: int = 64
    eps: float = 1e-6
    rope_base: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.dim // cfg.heads
        self.q = nn.Linear(cfg.dim, cfg.heads * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.heads * self.head_dim, cfg.dim, bias=False)

    def repeat_kv(self, x):
        """(B, kv_heads, T, hd) -> (B, heads, T, hd), each key/value head shared by a group of query heads."""
        b, kv, t, hd = x.shape
        group = self.heads // kv
        return x[:, :, None].expand(b, kv, group, t, hd).reshape(b, kv * group, t, hd)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        attended = F.scaled_dot_product_attention(q, self.repeat_kv(k), self.repeat_kv(v), is_causal=True)
        return self.o(attended.transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.eps)
        self.attention = LlamaAttention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.eps)
        self.gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaLike(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab); the output projection is the token embedding."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.lm_head.weight = self.tokens.weight
        head_dim = cfg.dim // cfg.heads
        inv_freq = 1.0 / cfg.rope_base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(cfg.max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for module in self.modules():  # LLaMA's initialisation: small logits from the tied projection
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.tokens(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def token_cross_entropy(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0):
    """Next-token cross-entropy over every position: logits (B, T, V), target (B, T) token ids.

    The cast to long lets int32 targets (token data as pock-train holds it) in as well.
    """
    return F.cross_entropy(
        logits.flatten(0, 1), target.flatten().long(), ignore_index=ignore_index, label_smoothing=label_smoothing
    )
