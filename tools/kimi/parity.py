#!/usr/bin/env python3
"""Whole-model parity for the kimi-linear architecture: a PyTorch float64 reference written from
docs/reference/kimi-linear.md (KDA per-token recurrence, naive un-absorbed NoPE MLA, sigmoid MoE
with a selection bias, renormalised unbiased weights and a routed scaling factor, one shared
expert) against `strata logits` on the same random model.

Steps: `strata synth --arch kimi-linear --preset tiny --format safetensors --dtype f32` writes an
HF KimiLinearForCausalLM directory; `strata convert --dtype f32` makes the GGUF; `strata logits
--kv-type f32` gives the engine's logits at every position of a fixed token sequence; this script
computes the reference from the HF directory (config.json + model.safetensors read directly) and
checks max |engine - reference| <= --tol (1e-3) over all positions and the vocabulary.

Usage: python3 tools/kimi/parity.py [--strata BIN] [--seed N] [--len T] [--tol X] [--json OUT]
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


def swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def kda_layer(x, W, p, cfg):
    """x [T, d] (normed input). Per-token gated delta rule, spec §2."""
    la = cfg["linear_attn_config"]
    H, D, K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    eps = cfg["rms_norm_eps"]
    T = x.shape[0]
    C = H * D

    def conv(name, z):  # z [T, C]; weight [C, 1, K] (tap K-1 = current token)
        w = W[p + name].reshape(C, K)
        zp = torch.cat([torch.zeros(K - 1, C), z], 0)
        y = torch.stack([(zp[t:t + K].T * w).sum(-1) for t in range(T)])
        return torch.nn.functional.silu(y)

    q = conv("q_conv1d.weight", x @ W[p + "q_proj.weight"].T).reshape(T, H, D)
    k = conv("k_conv1d.weight", x @ W[p + "k_proj.weight"].T).reshape(T, H, D)
    v = conv("v_conv1d.weight", x @ W[p + "v_proj.weight"].T).reshape(T, H, D)
    q = q / torch.clamp(q.norm(dim=-1, keepdim=True), min=eps) / math.sqrt(D)
    k = k / torch.clamp(k.norm(dim=-1, keepdim=True), min=eps)
    a = (x @ W[p + "f_a_proj.weight"].T) @ W[p + "f_b_proj.weight"].T + W[p + "dt_bias"].reshape(C)
    A = -torch.exp(W[p + "A_log"].reshape(H))
    g = (A[:, None] * torch.nn.functional.softplus(a.reshape(T, H, D)))  # [T, H, D] <= 0
    beta = torch.sigmoid(x @ W[p + "b_proj.weight"].T)  # [T, H]
    S = torch.zeros(H, D, D)  # [h, i (key), j (value)]
    o = torch.zeros(T, H, D)
    for t in range(T):
        S = S * torch.exp(g[t])[:, :, None]
        u = torch.einsum("hij,hi->hj", S, k[t])
        delta = beta[t][:, None] * (v[t] - u)
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hij,hi->hj", S, q[t])
    gate = (x @ W[p + "g_a_proj.weight"].T) @ W[p + "g_b_proj.weight"].T
    y = rmsnorm(o, W[p + "o_norm.weight"], eps) * torch.sigmoid(gate.reshape(T, H, D))
    return y.reshape(T, C) @ W[p + "o_proj.weight"].T


def mla_layer(x, W, p, cfg):
    """Naive NoPE MLA (kv_b decompressed per head), spec §3; scale 1/sqrt(nope + rope)."""
    H = cfg["num_attention_heads"]
    dc, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, vd = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    eps = cfg["rms_norm_eps"]
    T = x.shape[0]
    q = (x @ W[p + "q_proj.weight"].T).reshape(T, H, nope + dr)
    c = x @ W[p + "kv_a_proj_with_mqa.weight"].T
    ckv = rmsnorm(c[:, :dc], W[p + "kv_a_layernorm.weight"], eps)
    kpe = c[:, dc:]  # no rotation
    kv = (ckv @ W[p + "kv_b_proj.weight"].T).reshape(T, H, nope + vd)
    k = torch.cat([kv[:, :, :nope], kpe[:, None, :].expand(T, H, dr)], -1)
    val = kv[:, :, nope:]
    s = torch.einsum("thd,uhd->htu", q, k) / math.sqrt(nope + dr)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = s.masked_fill(mask, float("-inf"))
    pr = torch.softmax(s, -1)
    o = torch.einsum("htu,uhd->thd", pr, val).reshape(T, H * vd)
    return o @ W[p + "o_proj.weight"].T


def moe(x, W, p, cfg):
    E, K = cfg["num_experts"], cfg["num_experts_per_token"]
    mb = p + "block_sparse_moe."
    scores = torch.sigmoid(x @ W[mb + "gate.weight"].T)  # [T, E]
    key = scores + W[mb + "gate.e_score_correction_bias"]
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        ids = torch.topk(key[t], K).indices
        w = scores[t, ids]
        w = w / w.sum() * cfg["routed_scaling_factor"]
        for e, we in zip(ids.tolist(), w):
            ep = mb + f"experts.{e}."
            y[t] += we * swiglu(x[t], W[ep + "w1.weight"], W[ep + "w3.weight"],
                                W[ep + "w2.weight"])
    if cfg.get("num_shared_experts", 0) > 0:
        sh = mb + "shared_experts."
        y += swiglu(x, W[sh + "gate_proj.weight"], W[sh + "up_proj.weight"],
                    W[sh + "down_proj.weight"])
    return y


def reference_logits(model_dir, ids):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    W = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    eps = cfg["rms_norm_eps"]
    kda = set(l - 1 for l in cfg["linear_attn_config"]["kda_layers"])
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        xn = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        x = x + (kda_layer if l in kda else mla_layer)(xn, W, p + "self_attn.", cfg)
        xn = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        if cfg.get("num_experts", 0) > 0 and l >= cfg.get("first_k_dense_replace", 0):
            x = x + moe(xn, W, p, cfg)
        else:
            x = x + swiglu(xn, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"],
                           W[p + "mlp.down_proj.weight"])
    x = rmsnorm(x, W["model.norm.weight"], eps)
    return (x @ W["lm_head.weight"].T).numpy()


if __name__ == "__main__":
    sys.exit(hf_parity.main("kimi-linear", reference_logits, __doc__.split("\n")[0], 48))
