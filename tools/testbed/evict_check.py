#!/usr/bin/python3
"""Independent PyTorch check of the testbed recipe's eviction evaluation on exported models.

  /usr/bin/python3 tools/testbed/evict_check.py --models models/hf/nope-mla,models/hf/rope-mla \
      --lens 1024,2048 --trials 100 --json /tmp/evict.json

Why: `strata eval needle` (C++) on the shipped testbed models differs from the recipe's table
(docs/testbed.md, "Eviction evaluation") in a few cells. This script re-implements
the recipe's protocol from scratch in PyTorch, on the same exported weights, with two budget
variants per score (and three sigma diagnostics), so that a difference can be attributed to the
model or to the implementation:

  (a) "recipe": keep = 4 sinks [0, 4) + the 32 most recent prefix rows + the top m of the other
      rows by score; sigma uses ONE rFFT over the whole prefix.
  (b) "strata": the budget as Strata's policies define it (kv/baselines/eviction.h,
      kv/vestige/selector.h):
        snapkv  the observation window (last 32 prefix rows) + the top m of the rows before it
                (no sinks);
        h2o     the top m rows by column sums over all prefix queries (no sinks, no window);
        sigma   blocks of --block (1024) rows, each with its own rFFT (kappa bins kept), the 4
                sinks + the global top m of sigma over all closed rows (sinks may also be among
                the m), the unclosed tail [n_closed, P) kept; no recent window.
  (w) diagnostic, sigma only: Strata's budget (4 sinks + top m, no recent rows) on the recipe's
      whole-prefix sigma; a vs w isolates the 32 recent rows, w vs b the 1024-row blocks.
  (r) diagnostic, sigma only: the recipe's layout at Strata's total budget (4 sinks + 32 recent
      + top m - 32, whole-prefix sigma); r vs w: are the recent rows worth more than 32 scored ones?
  (x) diagnostic, sigma only: Strata's layout at the recipe's total budget (4 sinks + top m + 32,
      whole-prefix sigma, no recent rows); x vs a: the same question from the other side.
  m = round(P / ratio) (round half to even; Strata's sigma uses n_closed instead of P).
  For snapkv and h2o, w, r and x are the same as b.

Protocol (recipe): per trial an example `<s> filler[:a] <KEY> v1 v2 filler[a:F] <KEY> v1 v2`
(tools/testbed/README.md; KJV filler from `bible -l0 gen1:1-rev22:21`, whitespace collapsed; depth
u ~ U(0.1, 0.9)). The prefix (everything before the final <KEY>) has exactly T = --lens tokens,
as in `strata eval needle` (the recipe's example length was T, i.e. a prefix of T - 3; the three
rows do not matter for (a), but (b)'s 1024-row blocks only close when P >= 1024). The prefix runs
with the full cache; each layer's keep mask is computed from that layer's cached prefix rows
[c_hat ; r] (sigma) or from its prefix attention (H2O, SnapKV: softmax weights summed over the
4 heads, since MLA rows are shared). The query <KEY> and v1 are then run with every evicted prefix
row masked out in every layer (they see the kept rows and themselves, causally); a trial is a full
answer when the argmax at both steps is the answer (teacher forcing = greedy decoding).

Scores:
  sigma_r    || r_u - lowpass(r)_u ||, lowpass keeps rFFT bins [0, kappa) along the sequence per
             channel (r = the last 16 columns, rotated for the RoPE model, as cached);
  sigma_row  the same on the full row [c_hat ; r] (Strata's "fullrow");
  h2o        attention received from all prefix queries, summed over heads;
  snapkv     attention from the last 32 prefix queries, summed over heads, avg-pooled over keys
             (kernel 7, stride 1, zero padding 3, divided by 7) on the rows before the window.

Also reported per cell: the fraction of trials that keep both needle value rows, per layer, and
the median rank (as a fraction of P; 0 = kept first) of the better / worse value row and of the
needle KEY row by the score, per layer (the recipe's "per-layer needle-row ranks").

Runs behind the report (1 thread each, ~2-6 min on a busy 2-core machine):
  evict_check.py --lens 1024,2048 --trials 200,160                  # both models, a and b
  evict_check.py --models models/hf/rope-mla --lens 1024,2048 --trials 200,160 \
      --methods snapkv@8,snapkv@32 --evict-layers 0                 # (then --evict-layers 1)
  evict_check.py --models models/hf/nope-mla --lens 1024,2048 --trials 200,160 \
      --methods sigma_r:k4@8,sigma_r:k4@32,sigma_row:k4@32 --variants a,r,x,w,b

Standard output: progress lines, then one table. --json writes every cell. --kv-bf16 rounds the
cache rows to bf16 as the engine stores them (default f32, as the recipe). --evict-layers 0 (or 1)
evicts in that layer only and keeps every row of the others (a diagnostic of which layer's needle
rows the answer needs). Threads: 1 (torch).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tb_data  # noqa: E402
import tb_hf  # noqa: E402
import tb_model  # noqa: E402

SINKS = 4
RECENT = 32          # recipe's recent rows = SnapKV's observation window
SNAP_WINDOW = 32
SNAP_KERNEL = 7
DEFAULT_METHODS = ("full,sigma_r:k4@8,sigma_r:k4@32,sigma_row:k4@8,sigma_row:k4@32,"
                   "snapkv@8,snapkv@32,h2o@8,h2o@32")


# ----------------------------------------------------------------------------------------------
# Statistics


def wilson(k: int, n: int, z: float = 1.959963984540054):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, c - h), min(1.0, c + h))


# ----------------------------------------------------------------------------------------------
# Trials


def make_trials(corpus: tb_data.Corpus, prefix_len: int, n: int, seed: int):
    """n needle examples whose prefix has exactly prefix_len ids (example length prefix_len + 3).
    Seeded from (seed, prefix_len) only: both models see identical trials."""
    rng = np.random.default_rng([seed, 7, prefix_len])
    out = []
    for _ in range(n):
        ids, pos, (v1, v2) = tb_data.make_example(corpus, prefix_len + 3, rng, (0.1, 0.9))
        assert ids[prefix_len] == tb_data.KEY and ids[pos] == tb_data.KEY
        out.append({"ids": torch.from_numpy(ids), "key_pos": pos, "answer": (v1, v2)})
    return out


# ----------------------------------------------------------------------------------------------
# The MLA forward, split into a full-cache prefix pass and a masked query pass


def _rope_q(att: tb_model.MlaAttention, q, pos0: int):
    """q [H, T, nope + dr] -> q with the rope part rotated at positions pos0.. (RoPE model)."""
    c = att.c
    if c.kind != "rope":
        return q
    cos, sin = tb_model.rope_angles(q.shape[1], c.qk_rope_head_dim, c.rope_theta, q.device, pos0)
    nope = c.qk_nope_head_dim
    return torch.cat((q[..., :nope], tb_model.rope_interleaved(q[..., nope:], cos, sin)), dim=-1)


def _keys_values(att: tb_model.MlaAttention, rows):
    """Cache rows [T, d_c + d_r] -> per-head keys [H, T, nope + dr] and values [H, T, dv]."""
    c = att.c
    T = rows.shape[0]
    H, nope, dv = c.n_heads, c.qk_nope_head_dim, c.v_head_dim
    c_hat, r = rows[:, :c.kv_lora_rank], rows[:, c.kv_lora_rank:]
    kvb = att.kv_b_proj(c_hat).view(T, H, nope + dv).transpose(0, 1)
    k = torch.cat((kvb[..., :nope], r[None].expand(H, T, r.shape[-1])), dim=-1)
    return k, kvb[..., nope:]


@torch.no_grad()
def prefix_pass(model: tb_model.CausalLM, prefix, kv_bf16: bool, want_attn: bool):
    """Full-cache pass over the prefix [P]. Per layer: rows [P, 80] (as cached), keys/values,
    and (want_attn) the H2O column sums (all queries) and the SnapKV column sums (last 32
    queries), both summed over heads, f64 [P]."""
    c = model.config
    P = prefix.shape[0]
    H = c.n_heads
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    scale = 1.0 / math.sqrt(dq)
    x = model.model.embed_tokens(prefix[None])[0]  # [P, d]
    out = []
    for layer in model.model.layers:
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = _rope_q(att, att.q_proj(h).view(P, H, dq).transpose(0, 1), 0)
        rows = att.cache_rows(h[None], 0, kv_bf16)[0]
        k, v = _keys_values(att, rows)
        s = torch.baddbmm(tb_model.causal_mask(P, x.device)[None].expand(H, P, P), q,
                          k.transpose(1, 2), beta=1.0, alpha=scale)
        p = torch.softmax(s, dim=-1)
        o = torch.bmm(p, v).transpose(0, 1).reshape(P, -1)
        x = x + att.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        ent = {"rows": rows, "k": k, "v": v}
        if want_attn:
            ent["h2o"] = p.sum(dim=(0, 1)).double()
            ent["snap"] = p[:, P - SNAP_WINDOW:, :].sum(dim=(0, 1)).double()
        out.append(ent)
        del s, p
    return out


@torch.no_grad()
def query_logits(model: tb_model.CausalLM, cache, keeps, new_ids, P: int, kv_bf16: bool):
    """Runs new_ids [T] (the query <KEY> and v1) at positions P.. with, in every layer l, only
    the prefix rows keeps[l] (bool [P], or None = all) visible. Returns logits [T, vocab]."""
    c = model.config
    T = new_ids.shape[0]
    H = c.n_heads
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    scale = 1.0 / math.sqrt(dq)
    x = model.model.embed_tokens(new_ids[None])[0]
    causal = tb_model.causal_mask(T, x.device)
    for li, layer in enumerate(model.model.layers):
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = _rope_q(att, att.q_proj(h).view(T, H, dq).transpose(0, 1), P)
        rows = att.cache_rows(h[None], P, kv_bf16)[0]
        k_new, v_new = _keys_values(att, rows)
        ent = cache[li]
        if keeps[li] is None:
            k_old, v_old = ent["k"], ent["v"]
        else:
            idx = torch.nonzero(keeps[li]).flatten()
            k_old, v_old = ent["k"][:, idx], ent["v"][:, idx]
        k = torch.cat((k_old, k_new), dim=1)
        v = torch.cat((v_old, v_new), dim=1)
        s = torch.matmul(q, k.transpose(1, 2)) * scale  # [H, T, n_old + T]
        s[:, :, k_old.shape[1]:] += causal
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, v).transpose(0, 1).reshape(T, -1)
        x = x + att.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))


# ----------------------------------------------------------------------------------------------
# Scores and budgets


def lowpass_residual(x, kappa: int):
    """||x_u - lowpass(x)_u|| per row; x [n, C]; lowpass keeps rFFT bins [0, kappa) (f64)."""
    x = x.double()
    n = x.shape[0]
    X = torch.fft.rfft(x, dim=0)
    X[kappa:] = 0
    low = torch.fft.irfft(X, n=n, dim=0)
    return (x - low).norm(dim=1)


def channels(rows, kind: str, d_c: int):
    return rows[:, d_c:] if kind == "sigma_r" else rows


def snap_pool(col, P: int):
    """SnapKV's pooled score of the rows before the window: [P - 32] (f64)."""
    pre = col[:P - SNAP_WINDOW][None, None]
    return torch.nn.functional.avg_pool1d(pre, SNAP_KERNEL, stride=1,
                                          padding=SNAP_KERNEL // 2)[0, 0]


def top_m(score, cand, m: int):
    """Indices of the top m of score over the candidate rows (bool mask), ties to the lower
    position (stable sort on -score)."""
    idx = np.nonzero(cand)[0]
    if m <= 0 or idx.size == 0:
        return idx[:0]
    order = np.argsort(-score[idx], kind="stable")
    return idx[order[:m]]


def budget_m(n: int, ratio: float) -> int:
    return max(1, int(round(n / ratio)))  # Python round: half to even


def ranks(score, cand, rows_of_interest, P: int):
    """Rank (rows with a strictly higher score among the candidates) / P for each row."""
    s = score[cand]
    return [float((s > score[r]).sum()) / P if cand[r] else float("nan")
            for r in rows_of_interest]


class Method:
    """name:kappa@ratio, e.g. sigma_r:k4@8, snapkv@32, full."""

    def __init__(self, spec: str):
        self.spec = spec
        name, _, ratio = spec.partition("@")
        name, _, opt = name.partition(":")
        self.name = name
        self.kappa = int(opt[1:]) if opt.startswith("k") else 4
        self.ratio = float(ratio) if ratio else None
        if name not in ("full", "sigma_r", "sigma_row", "snapkv", "h2o"):
            raise ValueError(f"unknown method {spec!r}")
        if name != "full" and self.ratio is None:
            raise ValueError(f"{spec!r} needs @ratio")

    @property
    def needs_attn(self) -> bool:
        return self.name in ("snapkv", "h2o")


def keep_masks(method: Method, variant: str, ent, P: int, d_c: int, block: int):
    """(keep bool [P] numpy, score f64 numpy [P] for ranks, candidate mask for ranks)."""
    keep = np.zeros(P, dtype=bool)
    if method.name == "full":
        keep[:] = True
        return keep, None, None
    m = budget_m(P, method.ratio)
    if method.name.startswith("sigma"):
        x = channels(ent["rows"], method.name, d_c)
        if variant in ("a", "r"):
            score = lowpass_residual(x, method.kappa).numpy()
            keep[:SINKS] = True
            keep[P - RECENT:] = True
            keep[top_m(score, ~keep, m if variant == "a" else m - RECENT)] = True
            return keep, score, np.ones(P, dtype=bool)
        if variant == "x":
            score = lowpass_residual(x, method.kappa).numpy()
            keep[:SINKS] = True
            keep[top_m(score, np.ones(P, dtype=bool), m + RECENT)] = True
            return keep, score, np.ones(P, dtype=bool)
        if variant == "w":  # Strata's budget on the recipe's whole-prefix sigma
            n_closed = P
            score = lowpass_residual(x, method.kappa).numpy()
        else:
            n_closed = (P // block) * block
            score = np.full(P, np.inf)
            for b0 in range(0, n_closed, block):
                score[b0:b0 + block] = lowpass_residual(x[b0:b0 + block], method.kappa).numpy()
        keep[:SINKS] = True
        keep[n_closed:] = True
        closed = np.zeros(P, dtype=bool)
        closed[:n_closed] = True
        if n_closed:
            keep[top_m(score, closed, budget_m(n_closed, method.ratio))] = True
        return keep, score, closed
    if method.name == "snapkv":
        score = np.full(P, -np.inf)
        score[:P - SNAP_WINDOW] = snap_pool(ent["snap"], P).numpy()
        cand = np.zeros(P, dtype=bool)
        cand[:P - SNAP_WINDOW] = True
        keep[P - SNAP_WINDOW:] = True
        if variant == "a":
            keep[:SINKS] = True
        keep[top_m(score, cand & ~keep, m)] = True
        return keep, score, cand
    # h2o
    score = ent["h2o"].numpy()
    if variant == "a":
        keep[:SINKS] = True
        keep[P - RECENT:] = True
    keep[top_m(score, ~keep, m)] = True
    return keep, score, np.ones(P, dtype=bool)


FULL = Method("full")

# ----------------------------------------------------------------------------------------------
# Evaluation


class Cell:
    def __init__(self, n_layers: int):
        self.n = 0
        self.full = 0
        self.tok = 0
        self.kept_both = [0] * n_layers
        self.ranks = [[] for _ in range(n_layers)]  # per trial (best, worst, key)

    def row(self):
        lo, hi = wilson(self.full, self.n)
        med = []
        for rs in self.ranks:
            if rs:
                a = np.array(rs, dtype=float)
                med.append([float(np.nanmedian(a[:, j])) for j in range(3)])
            else:
                med.append(None)
        return {"n": self.n, "full": self.full, "acc": self.full / max(1, self.n),
                "wilson": [lo, hi], "token_acc": self.tok / max(1, 2 * self.n),
                "kept_both": [k / max(1, self.n) for k in self.kept_both], "median_ranks": med}


def run_model(model, trials, methods, variants, block, kv_bf16, label, progress_every,
              evict_layers=None):
    c = model.config
    want_attn = any(m.needs_attn for m in methods)
    cells = {}
    for m in methods:
        for var in (("-",) if m.name == "full" else variants):
            cells[(m.spec, var)] = Cell(c.n_layers)
    t0 = time.time()
    for i, tr in enumerate(trials):
        ids = tr["ids"]
        P = ids.shape[0] - 3
        prefix, new_ids = ids[:P], ids[P:P + 2]
        v1, v2 = tr["answer"]
        kpos = tr["key_pos"]
        cache = prefix_pass(model, prefix, kv_bf16, want_attn)
        for m in methods:
            for var in (("-",) if m.name == "full" else variants):
                keeps, cell = [], cells[(m.spec, var)]
                for li, ent in enumerate(cache):
                    if evict_layers is not None and li not in evict_layers:
                        keep, score, cand = keep_masks(FULL, var, ent, P, c.kv_lora_rank, block)
                    else:
                        keep, score, cand = keep_masks(m, var, ent, P, c.kv_lora_rank, block)
                    keeps.append(None if keep.all() else torch.from_numpy(keep))
                    cell.kept_both[li] += int(keep[kpos + 1] and keep[kpos + 2])
                    if score is not None:
                        rv = ranks(score, cand, [kpos + 1, kpos + 2, kpos], P)
                        cell.ranks[li].append([min(rv[0], rv[1]), max(rv[0], rv[1]), rv[2]])
                logits = query_logits(model, cache, keeps, new_ids, P, kv_bf16)
                pred = logits.argmax(dim=-1).tolist()
                ok = [pred[0] == v1, pred[1] == v2]
                cell.n += 1
                cell.tok += sum(ok)
                cell.full += int(all(ok))
        if (i + 1) % progress_every == 0 or i + 1 == len(trials):
            show = " ".join(f"{s}/{v}={cells[(s, v)].full}" for (s, v) in cells)
            print(f"  [{label}] {i + 1}/{len(trials)} trials, {time.time() - t0:.0f} s: {show}",
                  flush=True)
    return {f"{s}|{v}": cell.row() for (s, v), cell in cells.items()}


@torch.no_grad()
def self_test(model, trial, kv_bf16):
    """The split forward with everything kept equals the model's own forward."""
    ids = trial["ids"]
    P = ids.shape[0] - 3
    ref = model(ids[None, :P + 2], kv_bf16=kv_bf16)[0, P:P + 2]
    cache = prefix_pass(model, ids[:P], kv_bf16, False)
    got = query_logits(model, cache, [None] * len(cache), ids[P:P + 2], P, kv_bf16)
    err = (ref - got).abs().max().item()
    if err > 1e-3:
        raise SystemExit(f"self-test failed: split forward differs by {err:.2e}")
    return err


def fmt(r):
    return f"{r['acc']:.2f} [{r['wilson'][0]:.2f},{r['wilson'][1]:.2f}] / {r['token_acc']:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    ap.add_argument("--models", default=",".join(os.path.join(root, "models", "hf", m)
                                                 for m in ("nope-mla", "rope-mla")),
                    help="comma-separated HF export dirs")
    ap.add_argument("--lens", default="1024", help="prefix lengths T, comma-separated")
    ap.add_argument("--trials", default="100",
                    help="trials per length (one number, or one per length)")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help="comma-separated name[:kK]@ratio; names full, sigma_r, sigma_row, "
                         "snapkv, h2o (default: %(default)s)")
    ap.add_argument("--rope-methods", default=None,
                    help="methods for the RoPE model only (default: --methods)")
    ap.add_argument("--variants", default="a,b",
                    help="a (recipe budget), b (Strata budget); sigma diagnostics: w (whole-"
                         "prefix FFT, Strata's budget), r (recipe layout at Strata's total), "
                         "x (Strata layout at the recipe's total)")
    ap.add_argument("--evict-layers", default=None,
                    help="comma-separated layers to evict in (default: all)")
    ap.add_argument("--block", type=int, default=1024, help="Strata's sigma block (variant b)")
    ap.add_argument("--seed", type=int, default=20250)
    ap.add_argument("--kv-bf16", action="store_true", help="round cache rows to bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--progress-every", type=int, default=10)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    lens = [int(x) for x in a.lens.split(",")]
    ntr = [int(x) for x in a.trials.split(",")]
    if len(ntr) == 1:
        ntr = ntr * len(lens)
    if len(ntr) != len(lens):
        raise SystemExit("--trials: one number or one per length")
    variants = tuple(v for v in a.variants.split(",") if v)
    if not variants or not set(variants) <= {"a", "b", "w", "r", "x"}:
        raise SystemExit("--variants: some of a, b, w, r, x")
    evict_layers = ({int(x) for x in a.evict_layers.split(",")} if a.evict_layers else None)
    methods = [Method(s) for s in a.methods.split(",") if s]
    rope_methods = [Method(s) for s in a.rope_methods.split(",") if s] if a.rope_methods else None

    print("loading the KJV filler ...", flush=True)
    corpus = tb_data.Corpus.kjv()
    models = []
    for d in a.models.split(","):
        m = tb_hf.load(d)
        if not m.config.is_mla:
            raise SystemExit(f"{d}: not an MLA model")
        models.append((os.path.basename(os.path.normpath(d)), m))

    results = {"args": vars(a), "torch": torch.__version__, "cells": {}}
    for T, n in zip(lens, ntr):
        trials = make_trials(corpus, T, n, a.seed)
        for name, model in models:
            err = self_test(model, trials[0], a.kv_bf16)
            ms = rope_methods if (rope_methods and model.config.kind == "rope") else methods
            print(f"== {name} ({model.config.kind}) T={T}: {n} trials, {len(ms)} methods, "
                  f"self-test max |dlogit| {err:.1e}", flush=True)
            res = run_model(model, trials, ms, variants, a.block, a.kv_bf16, f"{name} T={T}",
                            a.progress_every, evict_layers)
            for k, v in res.items():
                results["cells"][f"{name}|{T}|{k}"] = v
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(results, f, indent=1)

    print("\nfull-answer accuracy [Wilson 95%] / token accuracy; needle rows: both value rows "
          "kept (layer 0, 1); median rank of value best/worst/KEY per layer (fraction of P)")
    print("| model | T | method | budget | accuracy | both kept L0, L1 | ranks L0 | ranks L1 |")
    print("|---|---|---|---|---|---|---|---|")
    for key, r in results["cells"].items():
        name, T, spec, var = key.split("|")
        kb = ", ".join(f"{x:.2f}" for x in r["kept_both"])
        rk = ["/".join(f"{x:.3f}" for x in mr) if mr else "-" for mr in r["median_ranks"]]
        budget = {"a": "(a) recipe", "b": "(b) strata", "w": "(w) whole+strata",
                  "r": "(r) recipe@strata total", "x": "(x) strata@recipe total", "-": "-"}[var]
        print(f"| {name} | {T} | {spec} | {budget} | {fmt(r)} | {kb} | {rk[0]} | {rk[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
