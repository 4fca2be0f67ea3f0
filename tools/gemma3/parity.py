#!/usr/bin/env python3
"""Whole-model parity for the gemma3 architecture: a PyTorch float64 reference written from the
HF Gemma3ForCausalLM text model (embeddings x sqrt(d_model); per layer RMSNorm with (1 + w), q/k
RMSNorm per head, RoPE on rotate_half pairs with the local base on sliding-window layers and
rope_theta on global ones, a causal window of `sliding_window` positions on local layers, softmax
scale 1/sqrt(query_pre_attn_scalar), post-attention norm, GELU-tanh gated FFN, post-FFN norm; tied
output) against `strata logits` on the same random model.

Steps: `strata synth --arch gemma3 --preset tiny --format safetensors --dtype f32` writes an HF
Gemma3ForCausalLM directory (3 layers: local, global, local; an 8-position window); `strata
convert --dtype f32` makes the GGUF (norm weights + 1, as llama.cpp's converter); `strata logits
--kv-type f32` gives the engine's logits at every position of a token sequence longer than the
window; this script computes the reference from the HF directory and checks max |engine -
reference| <= --tol (1e-3) over all positions and the vocabulary.

Usage: python3 tools/gemma3/parity.py [--strata BIN] [--seed N] [--len T] [--tol X] [--json OUT]
Exit 0 with "skipped: ..." when torch is not importable.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_parity  # noqa: E402  (exits 0 with "skipped: ..." without numpy or torch)
from hf_parity import read_safetensors, torch  # noqa: E402


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gemma_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope(x, pos, base):
    """HF rotate_half RoPE on [T, H, D] (pairs (i, i + D/2))."""
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].double() * inv[None, :]  # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(xn, W, p, cfg, local):
    T = xn.shape[0]
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    q = (xn @ W[p + "q_proj.weight"].T).view(T, H, D)
    k = (xn @ W[p + "k_proj.weight"].T).view(T, KV, D)
    v = (xn @ W[p + "v_proj.weight"].T).view(T, KV, D)
    q = gemma_norm(q, W[p + "q_norm.weight"], eps)
    k = gemma_norm(k, W[p + "k_norm.weight"], eps)
    pos = torch.arange(T)
    base = cfg["rope_local_base_freq"] if local else cfg["rope_theta"]
    q, k = rope(q, pos, base), rope(k, pos, base)
    G = H // KV
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    s = torch.einsum("thd,uhd->htu", q, k) / math.sqrt(cfg["query_pre_attn_scalar"])
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = j > i
    if local:
        mask = mask | (i - j >= cfg["sliding_window"])
    s = s.masked_fill(mask[None], float("-inf"))
    o = torch.einsum("htu,uhd->thd", torch.softmax(s, -1), v).reshape(T, H * D)
    return o @ W[p + "o_proj.weight"].T


def reference_logits(model_dir, ids):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    W = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    eps = cfg["rms_norm_eps"]
    emb = W["model.embed_tokens.weight"]
    x = emb[torch.tensor(ids)] * math.sqrt(cfg["hidden_size"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        local = cfg["layer_types"][l] == "sliding_attention"
        a = attention(gemma_norm(x, W[p + "input_layernorm.weight"], eps), W, p + "self_attn.",
                      cfg, local)
        x = x + gemma_norm(a, W[p + "post_attention_layernorm.weight"], eps)
        xn = gemma_norm(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        g = torch.nn.functional.gelu(xn @ W[p + "mlp.gate_proj.weight"].T, approximate="tanh")
        f = (g * (xn @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        x = x + gemma_norm(f, W[p + "post_feedforward_layernorm.weight"], eps)
    x = gemma_norm(x, W["model.norm.weight"], eps)
    return (x @ emb.T).numpy()


if __name__ == "__main__":
    sys.exit(hf_parity.main("gemma3", reference_logits, __doc__.split("\n")[0], 40))
