"""Testbed models in PyTorch, with parameter names equal to the Hugging Face checkpoint names.

- MLA (DeepseekV2ForCausalLM layout, dense FFN, full-rank q): NoPE (`mla_use_nope`: the decoupled
  branch r and q_r are never rotated) or RoPE (interleaved / adjacent-pair RoPE on q_r and r, which
  is HF DeepseekV2's convention after its view(d/2, 2).transpose permutation, and the engine's
  deepseek2 RopeStyle::kNorm).
- GQA (LlamaForCausalLM layout): HF Llama RoPE = rotate_half (pairs (i, i + d/2)); the engine's
  converter permutes q/k rows so that its adjacent-pair RoPE matches.
- Kimi Linear (KimiLinearForCausalLM layout, docs/reference/kimi-linear.md): KDA (Kimi Delta
  Attention) layers and NoPE MLA layers, dense SwiGLU FFN on every layer (first_k_dense_replace =
  n_layers: no MoE layer). KDA trains with the chunked form (`kda_chunked`: pairwise exponents
  Gamma_r - Gamma_s, never e^Gamma * e^-Gamma) and is tested against the per-token recurrence
  (`kda_recurrent`).

`kv_bf16=True` rounds what the engine stores in its bf16 KV cache, exactly where it stores it:
MLA rows [c_hat ; r] after kv_a_layernorm and (RoPE) rotation, GQA K after RoPE and V. Off for
training; on for parity with the engine. Everything else is f32 (KDA's recurrent and conv states
are f32 in the engine too, so kv_bf16 does not touch KDA layers).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    kind: str  # "nope" | "rope" (MLA) | "gqa" (llama) | "kimi" (KDA + NoPE MLA)
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
    # Kimi Linear: 0-based KDA layers (the others are NoPE MLA), KDA heads x head dim, the short
    # conv's kernel, the chunk length of the chunked (training) form.
    kda_layers: tuple = ()
    kda_heads: int = 4
    kda_head_dim: int = 32
    conv_kernel: int = 4
    kda_chunk: int = 16

    @property
    def is_mla(self) -> bool:
        """Every layer is MLA (the deepseek2 testbeds)."""
        return self.kind in ("nope", "rope")

    @property
    def is_kimi(self) -> bool:
        return self.kind == "kimi"

    def is_kda_layer(self, layer: int) -> bool:
        return self.is_kimi and layer in tuple(self.kda_layers)

    def mla_layers(self) -> list:
        """0-based layers with an MLA KV cache, in order."""
        if self.is_mla:
            return list(range(self.n_layers))
        if self.is_kimi:
            return [l for l in range(self.n_layers) if not self.is_kda_layer(l)]
        return []

    def to_dict(self):
        return asdict(self)


KINDS = ("nope", "rope", "gqa", "kimi", "nope576")


def config_for(kind: str) -> Config:
    if kind not in KINDS:
        raise ValueError(f"model kind {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "kimi":
        # KDA, KDA, NoPE MLA: Kimi Linear's 3:1 pattern in miniature; rms_norm_eps 1e-5 as the
        # real config (also the o_norm eps and the MLA kv_a_layernorm eps).
        return Config(kind=kind, n_layers=3, rms_eps=1e-5, kda_layers=(0, 1))
    if kind == "nope576":
        # NoPE MLA with Kimi Linear's cache row [c_hat 512 ; r 64] (kv_lora_rank 512,
        # qk_rope_head_dim 64, mla_use_nope). The body is small: d_model 256, 4 heads with
        # qk_nope 64 and v 64 (per-head widths half of Kimi's 128, so kv_b_proj is 512 x 512),
        # 3 layers (the multi-key needle binds a key name to its value: a NoPE model needs one
        # layer to carry the key into the value's position and one to match it; the third
        # leaves room for the previous-token signal NoPE has to build from the causal mask),
        # SwiGLU FFN 512 (the FFN was half the step time at 768). It is exported and loaded as kind "nope" (the geometry is in config.json).
        return Config(kind="nope", d_model=256, n_layers=3, n_heads=4, d_ff=512,
                      kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64)
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


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(sum x^2 + eps) over the last dimension (FLA / HF Kimi `l2norm`)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def kda_recurrent(q, k, v, g, beta, state=None):
    """The per-token gated delta rule with channel-wise decay (spec 2.2 step 6), exact.

    q, k [B, T, H, D] (q already L2-normed and scaled by 1/sqrt(D), k L2-normed), v [B, T, H, Dv],
    g [B, T, H, D] log-decay (<= 0), beta [B, T, H]; state [B, H, D, Dv] (rows = key channel i,
    columns = value channel j) or None for zeros. Returns (o [B, T, H, Dv], final state)."""
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    S = k.new_zeros(B, H, D, Dv) if state is None else state
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]  # decay along the key axis i
        kt, vt = k[:, t], v[:, t]
        u = torch.einsum("bhij,bhi->bhj", S, kt)
        delta = beta[:, t, :, None] * (vt - u)
        S = S + kt[..., :, None] * delta[..., None, :]
        out.append(torch.einsum("bhij,bhi->bhj", S, q[:, t]))
    return torch.stack(out, 1), S


def unit_lower_inverse(L):
    """(I + L)^-1 for strictly lower-triangular L [..., C, C]. L is nilpotent (L^C = 0), so
    (I + L)^-1 = sum_k (-L)^k = (I - L)(I + L^2)(I + L^4)...: log2(C) levels of batched matrix
    products (torch.linalg.solve_triangular loops over the batch on CPU, far slower here)."""
    C = L.shape[-1]
    eye = torch.eye(C, device=L.device, dtype=L.dtype)
    M = -L
    inv = eye + M
    p = 2
    while p < C:
        M = M @ M
        inv = inv @ (eye + M)
        p *= 2
    return inv


def kda_chunked(q, k, v, g, beta, state=None, chunk: int = 16):
    """The chunked (WY / UT) form of kda_recurrent (spec 2.3), equal up to rounding, for training
    and prefill. Within a chunk only pairwise exponents Gamma_r - Gamma_s (s <= r, so <= 0),
    Gamma_r and Gamma_C - Gamma_s are exponentiated: nothing overflows with strong decays. The
    last chunk is padded with g = 0, beta = 0, q = k = v = 0 and its padded outputs dropped."""
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    C = chunk
    N = (T + C - 1) // C
    pad = N * C - T

    def prep(x):  # [B, T, H, ...] -> [B, H, N, C, ...]
        x = x.transpose(1, 2)
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad))
        return x.reshape(x.shape[0], x.shape[1], N, C, *x.shape[3:])

    q, k, v, g = prep(q), prep(k), prep(v), prep(g)
    b = beta.transpose(1, 2)
    if pad:
        b = F.pad(b, (0, pad))
    b = b.reshape(B, H, N, C)
    G = g.cumsum(-2)  # Gamma_r, [B, H, N, C, D]
    diff = G[..., :, None, :] - G[..., None, :, :]  # [.., r, s, D] = Gamma_r - Gamma_s
    idx = torch.arange(C, device=k.device)
    causal = idx[:, None] >= idx[None, :]  # s <= r
    E = torch.where(causal[..., None], diff, diff.new_tensor(float("-inf"))).exp()  # 0 if s > r
    P = E * k[..., None, :, :]  # [.., r, s, D] = e^{Gamma_r - Gamma_s} k_s
    # One batched product per row r gives both sum_i k_r[i] P[r, s, i] and sum_i q_r[i] P[r, s, i].
    Z = torch.stack((k, q), -2) @ P.transpose(-1, -2)  # [.., r, 2, s]
    kk, qk = Z[..., 0, :], Z[..., 1, :]  # qk = A_qk incl. the diagonal
    strict = (idx[:, None] > idx[None, :]).to(k.dtype)
    eG = G.exp()
    rhs = b[..., None] * torch.cat((eG * k, v), -1)  # Diag(beta) [e^Gamma K | V]
    X = unit_lower_inverse(b[..., :, None] * kk * strict) @ rhs  # (I + L)^-1 Diag(beta) [..]
    W, U = X[..., :D], X[..., D:]
    Qg = q * eG
    GC = G[..., -1:, :]  # Gamma_C
    Kd = k * (GC - G).exp()  # e^{Gamma_C - Gamma_s} k_s
    dC = GC.squeeze(-2).exp()  # [B, H, N, D]
    S = k.new_zeros(B, H, D, Dv) if state is None else state
    outs = []
    for n in range(N):
        vn = U[:, :, n] - W[:, :, n] @ S  # V_new
        outs.append(Qg[:, :, n] @ S + qk[:, :, n] @ vn)
        S = dC[:, :, n, :, None] * S + Kd[:, :, n].transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).reshape(B, H, N * C, Dv)[:, :, :T]
    return o.transpose(1, 2), S


class ShortConv(nn.Module):
    """Causal depthwise conv over time, no bias, then SiLU. weight [channels, kernel]: tap
    kernel-1 multiplies the current token, tap 0 the token kernel-1 steps back; tokens before the
    sequence start are zeros."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, kernel))
        bound = 1.0 / math.sqrt(kernel)  # nn.Conv1d's default (fan_in = kernel for depthwise)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x):  # x [B, T, C]
        K = self.weight.shape[1]
        xt = F.pad(x.transpose(1, 2), (K - 1, 0))
        y = F.conv1d(xt, self.weight[:, None, :], groups=self.weight.shape[0])
        return F.silu(y.transpose(1, 2))


class KdaAttention(nn.Module):
    """Kimi Delta Attention (spec 2.1/2.2), HF parameter names of KimiDeltaAttention."""

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        d, H, D = c.d_model, c.kda_heads, c.kda_head_dim
        self.q_proj = nn.Linear(d, H * D, bias=False)
        self.k_proj = nn.Linear(d, H * D, bias=False)
        self.v_proj = nn.Linear(d, H * D, bias=False)
        self.q_conv1d = ShortConv(H * D, c.conv_kernel)
        self.k_conv1d = ShortConv(H * D, c.conv_kernel)
        self.v_conv1d = ShortConv(H * D, c.conv_kernel)
        # A_log per head (exp(A_log) uniform in [1, 16]); dt_bias per channel = softplus^-1(dt),
        # dt log-uniform in [1e-3, 1e-1] (the Mamba-style initialisation FLA uses).
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log().view(1, 1, H, 1))
        dt = torch.exp(torch.empty(H * D).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.f_a_proj = nn.Linear(d, D, bias=False)
        self.f_b_proj = nn.Linear(D, H * D, bias=False)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.g_a_proj = nn.Linear(d, D, bias=False)
        self.g_b_proj = nn.Linear(D, H * D, bias=False)
        self.o_norm = RMSNorm(D, c.rms_eps)
        self.o_proj = nn.Linear(H * D, d, bias=False)

    def gates(self, x):
        """(q, k, v [B, T, H, D] after conv, SiLU and (q, k) L2 norm, q scaled by 1/sqrt(D);
        g [B, T, H, D] log-decay; beta [B, T, H])."""
        c = self.c
        B, T, _ = x.shape
        H, D = c.kda_heads, c.kda_head_dim
        q = l2norm(self.q_conv1d(self.q_proj(x)).view(B, T, H, D)) * (D ** -0.5)
        k = l2norm(self.k_conv1d(self.k_proj(x)).view(B, T, H, D))
        v = self.v_conv1d(self.v_proj(x)).view(B, T, H, D)
        a = self.f_b_proj(self.f_a_proj(x)) + self.dt_bias
        g = -self.A_log.exp() * F.softplus(a.view(B, T, H, D))
        beta = torch.sigmoid(self.b_proj(x))
        return q, k, v, g, beta

    def output(self, x, o):
        c = self.c
        B, T, _ = x.shape
        gate = self.g_b_proj(self.g_a_proj(x)).view(B, T, c.kda_heads, c.kda_head_dim)
        y = self.o_norm(o) * torch.sigmoid(gate)  # norm each head first, then the sigmoid gate
        return self.o_proj(y.reshape(B, T, -1))

    def forward(self, x, kv_bf16: bool = False, recurrent: bool = False):
        q, k, v, g, beta = self.gates(x)
        if recurrent:
            o, _ = kda_recurrent(q, k, v, g, beta)
        else:
            o, _ = kda_chunked(q, k, v, g, beta, chunk=self.c.kda_chunk)
        return self.output(x, o)


class Mlp(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.up_proj = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down_proj = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: Config, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(c.d_model, c.rms_eps)
        if c.is_kda_layer(layer):
            self.self_attn = KdaAttention(c)
        elif c.is_mla or c.is_kimi:
            self.self_attn = MlaAttention(c)
        else:
            self.self_attn = GqaAttention(c)
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_eps)
        self.mlp = Mlp(c)

    def forward(self, x, kv_bf16: bool = False):
        x = x + self.self_attn(self.input_layernorm(x), kv_bf16)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList([Block(c, l) for l in range(c.n_layers)])
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
            if p.dim() == 1 or name.endswith("A_log") or name.endswith("conv1d.weight"):
                continue  # norms stay at 1; KDA's A_log, dt_bias and conv keep their own init
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
