"""Testbed models in PyTorch, with parameter names equal to the Hugging Face checkpoint names.

- MLA (DeepseekV2ForCausalLM layout, dense FFN, full-rank q): NoPE (`mla_use_nope`: the decoupled
  branch r and q_r are never rotated) or RoPE (interleaved / adjacent-pair RoPE on q_r and r, which
  is HF DeepseekV2's convention after its view(d/2, 2).transpose permutation, and the engine's
  deepseek2 RopeStyle::kNorm).
- GQA (LlamaForCausalLM layout): HF Llama RoPE = rotate_half (pairs (i, i + d/2)); the engine's
  converter permutes q/k rows so that its adjacent-pair RoPE matches.

`kv_bf16=True` rounds what the engine stores in its bf16 KV cache, exactly where it stores it:
MLA rows [c_hat ; r] after kv_a_layernorm and (RoPE) rotation, GQA K after RoPE and V. Off for
training; on for parity with the engine. Everything else is f32.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    kind: str  # "nope" | "rope" (MLA) | "gqa" (llama)
    vocab_size: int = 128
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    # MLA
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    # GQA
    n_kv_heads: int = 2
    head_dim: int = 32

    @property
    def is_mla(self) -> bool:
        return self.kind in ("nope", "rope")

    def to_dict(self):
        return asdict(self)


def config_for(kind: str) -> Config:
    if kind not in ("nope", "rope", "gqa"):
        raise ValueError(f"model kind {kind!r} is not one of nope, rope, gqa")
    return Config(kind=kind)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_angles(n_pos: int, dim: int, theta: float, device, pos0: int = 0):
    """cos, sin [n_pos, dim/2] for pair i with frequency theta^(-2i/dim) (computed in f64)."""
    inv = torch.exp(-torch.arange(0, dim, 2, dtype=torch.float64) / dim * math.log(theta))
    pos = torch.arange(pos0, pos0 + n_pos, dtype=torch.float64)
    ang = pos[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def rope_interleaved(x, cos, sin):
    """Adjacent pairs (2i, 2i+1). x [..., T, d]; cos/sin [T, d/2]."""
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.flatten(-2)


def rope_half(x, cos, sin):
    """rotate_half / neox pairs (i, i + d/2). x [..., T, d]; cos/sin [T, d/2]."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def round_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


_MASKS: dict = {}


def causal_mask(t: int, device):
    """[T, T] additive mask (0 on and below the diagonal, -inf above), cached per size."""
    key = (t, str(device))
    m = _MASKS.get(key)
    if m is None:
        if len(_MASKS) > 16:
            _MASKS.clear()
        m = torch.triu(torch.full((t, t), float("-inf"), device=device), diagonal=1)
        _MASKS[key] = m
    return m


def attend(q, k, v, scale: float):
    """q, k [B, H, T, dk], v [B, H, T, dv] -> [B, T, H * dv]. Score, scale and causal mask in one
    baddbmm call (the fused form the recipe measured ~1.6x faster on CPU)."""
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    s = torch.baddbmm(causal_mask(t, q.device), q.reshape(b * h, t, dk),
                      k.reshape(b * h, t, dk).transpose(1, 2), beta=1.0, alpha=scale)
    p = torch.softmax(s, dim=-1)
    o = torch.bmm(p, v.reshape(b * h, t, dv)).view(b, h, t, dv)
    return o.transpose(1, 2).reshape(b, t, h * dv)


class MlaAttention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        H, d = c.n_heads, c.d_model
        self.q_proj = nn.Linear(d, H * (c.qk_nope_head_dim + c.qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_eps)
        # Per head: nope rows (W_UK,h) then v rows (W_UV,h).
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, d, bias=False)

    def cache_rows(self, x, pos0: int = 0, kv_bf16: bool = False):
        """The engine's cache rows [B, T, d_c + d_r] = [c_hat ; r (rotated for RoPE)]."""
        c = self.c
        kv = self.kv_a_proj_with_mqa(x)
        c_hat = self.kv_a_layernorm(kv[..., :c.kv_lora_rank])
        r = kv[..., c.kv_lora_rank:]
        if c.kind == "rope":
            cos, sin = rope_angles(x.shape[1], c.qk_rope_head_dim, c.rope_theta, x.device, pos0)
            r = rope_interleaved(r, cos, sin)
        rows = torch.cat((c_hat, r), dim=-1)
        return round_bf16(rows) if kv_bf16 else rows

    def forward(self, x, kv_bf16: bool = False):
        c = self.c
        B, T, _ = x.shape
        H, nope, dr, dv = c.n_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_proj(x).view(B, T, H, nope + dr).transpose(1, 2)  # [B, H, T, nope + dr]
        rows = self.cache_rows(x, 0, kv_bf16)
        c_hat, r = rows[..., :c.kv_lora_rank], rows[..., c.kv_lora_rank:]
        kvb = self.kv_b_proj(c_hat).view(B, T, H, nope + dv).transpose(1, 2)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        if c.kind == "rope":
            cos, sin = rope_angles(T, dr, c.rope_theta, x.device)
            q = torch.cat((q[..., :nope], rope_interleaved(q[..., nope:], cos, sin)), dim=-1)
        k = torch.cat((k_nope, r[:, None].expand(B, H, T, dr)), dim=-1)
        o = attend(q, k, v, 1.0 / math.sqrt(nope + dr))
        return self.o_proj(o)


class GqaAttention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d, hd = c.d_model, c.head_dim
        self.q_proj = nn.Linear(d, c.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, c.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, c.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.n_heads * hd, d, bias=False)

    def forward(self, x, kv_bf16: bool = False):
        c = self.c
        B, T, _ = x.shape
        H, G, hd = c.n_heads, c.n_kv_heads, c.head_dim
        q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, G, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, G, hd).transpose(1, 2)
        cos, sin = rope_angles(T, hd, c.rope_theta, x.device)
        q, k = rope_half(q, cos, sin), rope_half(k, cos, sin)
        if kv_bf16:
            k, v = round_bf16(k), round_bf16(v)
        rep = H // G
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        return self.o_proj(attend(q, k, v, 1.0 / math.sqrt(hd)))


class Mlp(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(c.d_model, c.rms_eps)
        self.self_attn = MlaAttention(c) if c.is_mla else GqaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_eps)
        self.mlp = Mlp(c)

    def forward(self, x, kv_bf16: bool = False):
        x = x + self.self_attn(self.input_layernorm(x), kv_bf16)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList([Block(c) for _ in range(c.n_layers)])
        self.norm = RMSNorm(c.d_model, c.rms_eps)


class CausalLM(nn.Module):
    """state_dict() keys are the HF names (model.embed_tokens.weight, ..., lm_head.weight)."""

    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init()

    def _init(self):
        std = 0.02
        out_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norms stay at 1
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def hidden(self, ids, kv_bf16: bool = False):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, kv_bf16)
        return self.model.norm(x)

    def forward(self, ids, kv_bf16: bool = False):
        """ids [B, T] int64 -> logits [B, T, vocab] f32."""
        return self.lm_head(self.hidden(ids, kv_bf16))


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
