#!/usr/bin/python3
"""Tests of the testbed tools (plain unittest; ctest runs tools/testbed/test_parity.sh).

Without torch the whole file is skipped (exit 0). The engine parity test runs only when a strata
binary with the `convert` and `logits` commands is found ($STRATA_BIN, build/release/strata or
the first argument of test_parity.sh); otherwise it is skipped with a message.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import torch
except ImportError:  # pragma: no cover - the CI image without torch
    print("skipped: torch is not importable (install python3-torch; use /usr/bin/python3)")
    sys.exit(0)

import numpy as np  # noqa: E402

import export as tb_export  # noqa: E402
import parity  # noqa: E402
import tb_data  # noqa: E402
import tb_hf  # noqa: E402
import tb_model  # noqa: E402

torch.set_num_threads(1)


def engine_like_logits(model_dir: str, ids: np.ndarray, kv_bf16: bool = True) -> np.ndarray:
    """A float64 numpy forward that consumes the exported tensors the way io/hf.cc converts them
    and model/{deepseek2,llama}.cc use them: absorbed MLA over [c_hat ; r] rows with attn_k_b /
    attn_v_b split from kv_b_proj, adjacent-pair RoPE (llama: on permuted q/k rows)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = {k: v.astype(np.float64) for k, v in
         tb_hf.read_safetensors(os.path.join(model_dir, tb_hf.SAFETENSORS_NAME)).items()}
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(ids)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope_adjacent(x, dim):  # x [T, ..., dim] rotated at positions 0..T-1
        i = np.arange(dim // 2)
        ang = np.arange(T)[:, None] * np.exp(-2.0 * i / dim * math.log(theta))[None]
        shape = (T,) + (1,) * (x.ndim - 2) + (dim // 2,)
        c, s = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    def bf16(x):
        if not kv_bf16:
            return x
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).double().numpy()

    def softmax_causal(s):  # s [H, T, T]
        s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
        s = np.exp(s - s.max(-1, keepdims=True))
        return s / s.sum(-1, keepdims=True)

    def permute(m, n_head):  # llama.cpp LlamaModel.permute, as io/hf.cc PermuteRows
        rows = m.shape[0]
        return m.reshape(n_head, 2, rows // n_head // 2, -1).swapaxes(1, 2).reshape(m.shape)

    x = w["model.embed_tokens.weight"][ids]
    H = cfg["num_attention_heads"]
    mla = cfg["architectures"][0] == "DeepseekV2ForCausalLM"
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        if mla:
            dc, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
            nope, dv = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            use_rope = not cfg["mla_use_nope"]
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, nope + dr)
            kva = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
            c_hat = rms(kva[:, :dc], w[p + "self_attn.kv_a_layernorm.weight"])
            r = rope_adjacent(kva[:, dc:], dr) if use_rope else kva[:, dc:]
            rows = bf16(np.concatenate([c_hat, r], -1))  # [T, dc + dr]
            kvb = w[p + "self_attn.kv_b_proj.weight"].reshape(H, nope + dv, dc)
            k_b = kvb[:, :nope, :].transpose(0, 2, 1)  # attn_k_b [H, dc, nope] = W_UK,h^T
            v_b = kvb[:, nope:, :]  # attn_v_b [H, dv, dc]
            q_abs_c = np.einsum("hcn,thn->thc", k_b, q[..., :nope])
            q_pe = rope_adjacent(q[..., nope:], dr) if use_rope else q[..., nope:]
            q_abs = np.concatenate([q_abs_c, q_pe], -1)  # [T, H, dc + dr]
            s = np.einsum("thk,uk->htu", q_abs, rows) / math.sqrt(nope + dr)
            att = np.einsum("htu,uc->thc", softmax_causal(s), rows[:, :dc])
            o = np.einsum("hvc,thc->thv", v_b, att).reshape(T, H * dv)
        else:
            G, hd = cfg["num_key_value_heads"], cfg["head_dim"]
            q = h @ permute(w[p + "self_attn.q_proj.weight"], H).T
            k = h @ permute(w[p + "self_attn.k_proj.weight"], G).T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            q = rope_adjacent(q.reshape(T, H, hd), hd)
            k = bf16(rope_adjacent(k.reshape(T, G, hd), hd))
            v = bf16(v.reshape(T, G, hd))
            rep = H // G
            s = np.einsum("thd,uhd->htu", q, np.repeat(k, rep, axis=1)) / math.sqrt(hd)
            o = np.einsum("htu,uhd->thd", softmax_causal(s), np.repeat(v, rep, axis=1))
            o = o.reshape(T, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def hf_deepseek_rope(x, cos, sin):
    """HF modeling_deepseek.apply_rotary_pos_emb: de-interleave, then rotate_half."""
    b, h, s, d = x.shape
    x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    c, sn = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return x * c + torch.cat((-x2, x1), -1) * sn


class Tmp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="strata-testbed-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class VocabAndDataTest(unittest.TestCase):
    def test_tokenizer_layout(self):
        tj = tb_hf.tokenizer_json()
        toks = tj["tokens"]
        self.assertEqual(len(toks), 128)
        self.assertEqual(len(set(toks)), 128)
        self.assertEqual(toks[0], "<s>")
        self.assertEqual(toks[1], "<KEY>")
        self.assertEqual(toks[2], "<v0>")
        self.assertEqual(toks[49], "<v47>")
        self.assertEqual(toks[50], "\u2581")
        self.assertEqual(tj["token_types"][:3], [3, 4, 4])
        self.assertEqual(tj["token_types"][50:52], [1, 1])
        self.assertEqual(tj["token_types"][-1], 5)
        self.assertEqual(len(tj["scores"]), 128)
        self.assertFalse(tj["add_bos_token"])
        self.assertFalse(tj["add_space_prefix"])

    def test_example_layout_and_masks(self):
        corpus = tb_data.Corpus.synthetic(1)
        rng = np.random.default_rng(0)
        for L in (16, 64, 129, 512):
            ids, pos, (v1, v2) = tb_data.make_example(corpus, L, rng)
            self.assertEqual(len(ids), L)
            self.assertEqual(ids[0], tb_data.BOS)
            self.assertEqual(list(ids[pos:pos + 3]), [tb_data.KEY, v1, v2])
            self.assertEqual(list(ids[-3:]), [tb_data.KEY, v1, v2])
            self.assertTrue(2 <= v1 <= 17 and 18 <= v2 <= 33)
            cls = tb_data.example_masks(L, pos)
            # Targets ids[1:]: every value/KEY target is ignored or an answer, never filler.
            tgt = ids[1:]
            self.assertTrue(np.all(tgt[cls == tb_data.T_FILLER] >= tb_data.CHAR_BASE))
            self.assertEqual(list(tgt[cls == tb_data.T_ANSWER]), [v1, v2])
            self.assertEqual(int((cls == tb_data.T_IGNORE).sum()), 4)

    def test_multikey_example_layout_and_masks(self):
        corpus = tb_data.Corpus.synthetic(2)
        rng = np.random.default_rng(3)
        asked = set()
        for L in (40, 64, 129, 512, 4096):
            ids, pos, (v1, v2) = tb_data.make_example_multikey(corpus, L, rng)
            self.assertEqual(len(ids), L)
            self.assertEqual(ids[0], tb_data.BOS)
            self.assertEqual(len(pos), tb_data.N_KEYS)
            names, v1s, v2s = [], [], []
            for i, p in enumerate(pos):
                if i:
                    self.assertGreaterEqual(p, pos[i - 1] + 4)  # in order, never overlapping
                self.assertEqual(ids[p], tb_data.KEY)
                names.append(int(ids[p + 1]))
                v1s.append(int(ids[p + 2]))
                v2s.append(int(ids[p + 3]))
            self.assertTrue(all(34 <= k <= 49 for k in names))
            self.assertTrue(all(2 <= v <= 17 for v in v1s) and all(18 <= v <= 33 for v in v2s))
            for group in (names, v1s, v2s):
                self.assertEqual(len(set(group)), tb_data.N_KEYS)
            # The query names one of the keys; the answer is that needle's values.
            self.assertEqual(ids[-4], tb_data.KEY)
            q = names.index(int(ids[-3]))
            asked.add(q)
            self.assertEqual((v1, v2), (v1s[q], v2s[q]))
            self.assertEqual(list(ids[-2:]), [v1, v2])
            # KEY, names and values occur only in the needles and the query.
            self.assertEqual(int((ids < tb_data.CHAR_BASE).sum()), 1 + 4 * tb_data.N_KEYS + 4)
            cls = tb_data.example_masks_multikey(L, pos)
            tgt = ids[1:]
            self.assertTrue(np.all(tgt[cls == tb_data.T_FILLER] >= tb_data.CHAR_BASE))
            self.assertEqual(list(tgt[cls == tb_data.T_ANSWER]), [v1, v2])
            self.assertEqual(int((cls == tb_data.T_IGNORE).sum()), 4 * tb_data.N_KEYS + 2)
        self.assertGreater(len(asked), 1)
        # A batch of both kinds: the answer is the last two ids either way; an unknown kind is an
        # error; one kind draws nothing extra (the single-kind stream of earlier runs).
        ids, cls = tb_data.make_batch(corpus, 96, 16, np.random.default_rng(1),
                                      kinds=("single", "multikey"))
        self.assertEqual(ids.shape, (16, 96))
        self.assertTrue(np.all((cls == tb_data.T_ANSWER).sum(1) == 2))
        n_keys = (ids == tb_data.KEY).sum(1)
        self.assertEqual(set(n_keys.tolist()), {2, tb_data.N_KEYS + 1})
        a, _ = tb_data.make_batch(corpus, 64, 4, np.random.default_rng(9))
        b = np.stack([tb_data.make_example(corpus, 64, r)[0]
                      for r in [np.random.default_rng(9)] for _ in range(4)])
        self.assertTrue(np.array_equal(a, b))
        with self.assertRaises(ValueError):
            tb_data.make_batch(corpus, 64, 2, rng, kinds=("multi",))

    def test_nope576_geometry(self):
        c = tb_model.config_for("nope576")
        self.assertEqual((c.kind, c.kv_lora_rank, c.qk_rope_head_dim), ("nope", 512, 64))
        m = tb_model.CausalLM(c)
        rows = m.model.layers[0].self_attn.cache_rows(torch.zeros(1, 5, c.d_model))
        self.assertEqual(tuple(rows.shape), (1, 5, 576))  # Kimi Linear's cache row
        cfg = tb_hf.hf_config(c)
        self.assertTrue(cfg["mla_use_nope"])
        self.assertEqual(cfg["kv_lora_rank"], 512)

    def test_kjv_alphabet(self):
        try:
            text = tb_data.load_kjv_text()
        except RuntimeError as e:
            self.skipTest(str(e))
        self.assertLessEqual(set(text), set(tb_data.ALPHABET))
        self.assertGreater(len(tb_data.encode_chars(text[:1000])), 990)


class ExportTest(Tmp):
    def test_names_shapes_config(self):
        for kind in ("nope", "rope", "gqa"):
            d = os.path.join(self.tmp, kind)
            m = tb_export.random_model(kind, 3)
            tb_hf.export(m, d)
            with open(os.path.join(d, tb_hf.SAFETENSORS_NAME), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
            self.assertEqual((8 + n) % 8, 0)
            t = tb_hf.read_safetensors(os.path.join(d, tb_hf.SAFETENSORS_NAME))
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            # The keys io/hf.cc ConvertHfDirectory reads.
            for k in ("architectures", "num_hidden_layers", "hidden_size", "intermediate_size",
                      "num_attention_heads", "num_key_value_heads", "vocab_size",
                      "max_position_embeddings", "rms_norm_eps", "rope_theta",
                      "tie_word_embeddings"):
                self.assertIn(k, cfg)
            self.assertFalse(cfg["tie_word_embeddings"])
            d_model, H = cfg["hidden_size"], cfg["num_attention_heads"]
            shapes = {"model.embed_tokens.weight": [128, d_model], "lm_head.weight":
                      [128, d_model], "model.norm.weight": [d_model]}
            for l in range(2):
                p = f"model.layers.{l}."
                shapes[p + "input_layernorm.weight"] = [d_model]
                shapes[p + "post_attention_layernorm.weight"] = [d_model]
                shapes[p + "mlp.gate_proj.weight"] = [256, d_model]
                shapes[p + "mlp.up_proj.weight"] = [256, d_model]
                shapes[p + "mlp.down_proj.weight"] = [d_model, 256]
                a = p + "self_attn."
                if kind == "gqa":
                    self.assertEqual(cfg["architectures"], ["LlamaForCausalLM"])
                    self.assertEqual((cfg["num_key_value_heads"], cfg["head_dim"]), (2, 32))
                    shapes[a + "q_proj.weight"] = [H * 32, d_model]
                    shapes[a + "k_proj.weight"] = [2 * 32, d_model]
                    shapes[a + "v_proj.weight"] = [2 * 32, d_model]
                    shapes[a + "o_proj.weight"] = [d_model, H * 32]
                else:
                    self.assertEqual(cfg["architectures"], ["DeepseekV2ForCausalLM"])
                    self.assertEqual(cfg["mla_use_nope"], kind == "nope")
                    self.assertIsNone(cfg["q_lora_rank"])
                    self.assertIsNone(cfg["n_routed_experts"])
                    self.assertEqual(cfg["first_k_dense_replace"], 2)
                    nope, dr, dv, dc = (cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                                        cfg["v_head_dim"], cfg["kv_lora_rank"])
                    self.assertEqual((nope, dr, dv, dc), (32, 16, 32, 64))
                    shapes[a + "q_proj.weight"] = [H * (nope + dr), d_model]
                    shapes[a + "kv_a_proj_with_mqa.weight"] = [dc + dr, d_model]
                    shapes[a + "kv_a_layernorm.weight"] = [dc]
                    shapes[a + "kv_b_proj.weight"] = [H * (nope + dv), dc]
                    shapes[a + "o_proj.weight"] = [d_model, H * dv]
            self.assertEqual({k: list(v.shape) for k, v in t.items()}, shapes)
            # Round trip.
            m2 = tb_hf.load(d)
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, m2.state_dict()[k]), k)
            with open(os.path.join(d, tb_hf.TOKENIZER_NAME), encoding="utf-8") as f:
                self.assertEqual(json.load(f), tb_hf.tokenizer_json())

    def test_param_count_matches_recipe(self):
        self.assertEqual(tb_model.n_params(tb_model.CausalLM(tb_model.config_for("nope"))),
                         365312)


class ConventionTest(Tmp):
    def test_mla_rope_equals_hf_deepseek(self):
        torch.manual_seed(0)
        T, d = 37, 16
        q, k = torch.randn(1, 4, T, d), torch.randn(1, 1, T, d)
        cos, sin = tb_model.rope_angles(T, d, 10000.0, "cpu")
        ours = tb_model.rope_interleaved(q, cos, sin) @ tb_model.rope_interleaved(
            k, cos, sin).transpose(-1, -2)
        hf = hf_deepseek_rope(q, cos, sin) @ hf_deepseek_rope(k, cos, sin).transpose(-1, -2)
        self.assertLess(float((ours - hf).abs().max()), 1e-4)

    def test_rope_is_relative(self):
        # <rot(q, m), rot(k, n)> depends on m - n only, for both styles.
        torch.manual_seed(1)
        q, k = torch.randn(16), torch.randn(16)
        for fn in (tb_model.rope_interleaved, tb_model.rope_half):
            cos, sin = tb_model.rope_angles(40, 16, 10000.0, "cpu")
            a = fn(q.expand(40, 16), cos, sin)
            b = fn(k.expand(40, 16), cos, sin)
            self.assertAlmostEqual(float(a[10] @ b[3]), float(a[30] @ b[23]), places=4)

    def test_engine_like_forward_matches(self):
        """The PyTorch model equals the engine's absorbed / permuted formulation (f64 numpy, the
        same bf16 cache rounding) for all three kinds; the bf16 rounding is visible."""
        corpus = tb_data.Corpus.synthetic(2)
        ids, _, _ = tb_data.make_example(corpus, 96, np.random.default_rng(5))
        for kind in ("nope", "rope", "gqa"):
            d = os.path.join(self.tmp, kind)
            tb_hf.export(tb_export.random_model(kind, 11, init_scale=4.0), d)
            model = tb_hf.load(d)
            with torch.no_grad():
                ours = model(torch.from_numpy(ids[None]), kv_bf16=True)[0].double().numpy()
                ours32 = model(torch.from_numpy(ids[None]), kv_bf16=False)[0].double().numpy()
            ref = engine_like_logits(d, ids, kv_bf16=True)
            ref32 = engine_like_logits(d, ids, kv_bf16=False)
            scale = np.abs(ref).max()
            self.assertGreater(scale, 1.0, kind)
            self.assertLess(np.abs(ours32 - ref32).max(), 1e-4 * max(1.0, scale), kind)
            self.assertLess(np.abs(ours - ref).max(), 2e-4 * max(1.0, scale), kind)
            self.assertGreater(np.abs(ref - ref32).max(), 1e-4, kind)  # rounding does something


class TrainResumeTest(Tmp):
    def test_checkpoint_resume(self):
        try:
            tb_data.load_kjv_text()
        except RuntimeError as e:
            self.skipTest(str(e))
        out = os.path.join(self.tmp, "run")
        common = [sys.executable, os.path.join(HERE, "train.py"), "--model", "rope", "--out", out,
                  "--tokens-per-step", "256", "--stages", "32,64", "--eval-every-s", "2",
                  "--ckpt-every-s", "2", "--final-eval", "64:8", "--no-export"]
        r = subprocess.run(common + ["--budget-min", str(4 / 60)], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            s1 = json.load(f)
        self.assertGreater(s1["steps"], 0)
        r = subprocess.run(common + ["--budget-min", str(8 / 60)], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"resumed at step {s1['steps']}", r.stdout)
        with open(os.path.join(out, "summary.json")) as f:
            s2 = json.load(f)
        self.assertGreater(s2["steps"], s1["steps"])
        steps = []
        with open(os.path.join(out, "log.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if rec["t"] == "step":
                    steps.append(rec["step"])
        self.assertEqual(steps, list(range(1, s2["steps"] + 1)))  # no gaps, no repeats


class WarmStartAndBf16Test(Tmp):
    def test_init_from_starts_from_the_given_weights(self):
        try:
            tb_data.load_kjv_text()
        except RuntimeError as e:
            self.skipTest(str(e))
        src = os.path.join(self.tmp, "src")
        torch.manual_seed(11)
        m = tb_model.CausalLM(tb_model.config_for("nope"))
        tb_hf.export(m, src)
        out = os.path.join(self.tmp, "run")
        # No training time: the export is the starting point itself.
        r = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--model", "nope",
                            "--out", out, "--budget-min", "0", "--final-eval", "",
                            "--init-from", src], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        a = tb_hf.read_safetensors(os.path.join(src, "model.safetensors"))
        b = tb_hf.read_safetensors(os.path.join(out, "hf", "model.safetensors"))
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        # Another geometry is refused by name.
        r = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--model", "gqa",
                            "--out", os.path.join(self.tmp, "run2"), "--budget-min", "0",
                            "--final-eval", "", "--init-from", src], capture_output=True,
                           text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--init-from", r.stderr)

    def test_bf16_safetensors_round_to_nearest_even(self):
        x = np.array([1.0, 1.00390625, 1.01171875, -3.140625, 1e-3, 65504.0], dtype=np.float32)
        x = np.concatenate([x, np.random.default_rng(0).normal(size=1000).astype(np.float32)])
        path = os.path.join(self.tmp, "w.safetensors")
        tb_hf.write_safetensors(path, {"w": x}, {"k": "v"}, "BF16")
        y = tb_hf.read_safetensors(path)["w"]
        # Reference: round each value to the nearest bf16 in float64, ties to even.
        bits = x.view(np.uint32).astype(np.uint64)
        lo = (bits >> 16) << 16
        hi = lo + (1 << 16)
        fl = lo.astype(np.uint32).view(np.float32).astype(np.float64)
        fh = hi.astype(np.uint32).view(np.float32).astype(np.float64)
        d_lo, d_hi = np.abs(x - fl), np.abs(fh - x)
        even_lo = ((lo >> 16) & 1) == 0
        want = np.where((d_lo < d_hi) | ((d_lo == d_hi) & even_lo), fl, fh).astype(np.float32)
        np.testing.assert_array_equal(y, want)
        self.assertEqual(y[1], 1.0)  # 1 + 2^-8 is a tie: to even
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            self.assertEqual(json.loads(f.read(n))["w"]["dtype"], "BF16")
        self.assertEqual(os.path.getsize(path) - 8 - n, 2 * x.size)


def engine_layout_dump(tensors: list, kind: str) -> np.ndarray:
    """The reference's cache tensors (bf16 bit patterns, in the order tb_model rounds them: MLA
    one [1, T, W] per layer, GQA K then V [1, G, T, hd] per layer) as `strata logits --dump-kv`
    lays them out: per layer T rows, MLA [c_hat ; r], GQA [K heads (engine dim order) ; V heads]."""
    layers = []
    if kind != "gqa":
        for t in tensors:
            layers.append(t[0])
    else:
        for k, v in zip(tensors[0::2], tensors[1::2]):
            _, G, T, hd = k.shape
            # HF dim s*hd/2 + i -> engine dim 2i + s (io/hf.cc PermuteRows of the k rows).
            ke = k[0].transpose(1, 0, 2).reshape(T, G, 2, hd // 2).swapaxes(-1, -2)
            layers.append(np.concatenate([ke.reshape(T, G * hd),
                                          v[0].transpose(1, 0, 2).reshape(T, G * hd)], -1))
    return np.stack(layers).astype("<u2")


class EngineKvSubstitutionTest(Tmp):
    """parity.py's cache check without the engine: a dump made from the reference's own values,
    with every ambiguous element rounded the other way, is taken there and only there (the
    logits equal a forward over exactly the dumped cache), and one wrong element elsewhere is a
    mismatch."""

    def test_ambiguous_elements_take_the_dump_and_others_are_checked(self):
        corpus = tb_data.Corpus.synthetic(3)
        ids, _, _ = tb_data.make_example(corpus, 40, np.random.default_rng(7))
        rel = 1e-4  # wide, so that a 40-token run has many ambiguous elements
        for kind in ("nope", "rope", "gqa"):
            d = os.path.join(self.tmp, kind)
            tb_hf.export(tb_export.random_model(kind, 13, init_scale=4.0), d)
            model = tb_hf.load(d)
            x = torch.from_numpy(ids[None].astype(np.int64))
            with torch.no_grad():
                own_logits = model(x, kv_bf16=True)[0].numpy()
            # The "engine": rounds every ambiguous element the other way, layer after layer (a
            # later layer's values depend on the earlier layers' cache), and stores the result.
            seen, engine, counts = [], [], [0, 0]

            def other_way(t):
                t = t.detach().numpy().copy()
                own = parity.bf16_bits(t)
                amb, lo, hi = parity.rounding_bounds(t, rel, model.config.kv_lora_rank
                                                     if kind != "gqa" else None)
                other = np.where(own == lo, hi, lo)
                seen.append(t)
                engine.append(np.where(amb, other, own))
                counts[0] += int(amb.sum())
                counts[1] += t.size
                return torch.from_numpy(parity.bf16_to_f32(engine[-1]))

            orig = tb_model.round_bf16
            tb_model.round_bf16 = other_way
            try:
                with torch.no_grad():
                    exact = model(x, kv_bf16=True)[0].numpy()
            finally:
                tb_model.round_bf16 = orig
            n_amb, n_el = counts
            self.assertEqual(len(engine), 2 if kind != "gqa" else 4, kind)
            self.assertGreater(n_amb, 20, kind)
            path = os.path.join(self.tmp, kind + ".kv")
            engine_layout_dump(engine, kind).tofile(path)
            got, st = parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path,
                                              ambiguous_rel=rel)
            self.assertIs(tb_model.round_bf16, orig)  # restored
            self.assertEqual((st["kv_elements"], st["kv_ambiguous"], st["kv_mismatches"]),
                             (n_el, n_amb, 0), kind)
            self.assertEqual(st["kv_ambiguous_taken_from_engine_differing"], n_amb, kind)
            # The same logits as the forward over exactly the dumped cache.
            np.testing.assert_array_equal(got, exact, err_msg=kind)
            self.assertGreater(np.abs(got - own_logits).max(), 0.0, kind)
            # One element off by a bf16 ulp away from any boundary: a mismatch, named.
            amb0, _, hi0 = parity.rounding_bounds(seen[-1], rel, model.config.kv_lora_rank
                                                  if kind != "gqa" else None)
            idx = tuple(int(i) for i in np.argwhere(~amb0)[3])
            engine[-1] = engine[-1].copy()
            engine[-1][idx] += np.uint16(1)
            engine_layout_dump(engine, kind).tofile(path)
            _, st = parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path,
                                            ambiguous_rel=rel)
            self.assertEqual((st["kv_mismatches"], st["kv_ambiguous_outside_bounds"]), (1, 0),
                             kind)
            self.assertEqual(len(st["kv_mismatch_examples"]), 1, kind)
            self.assertIn(f"layer 1 token {idx[2] if kind == 'gqa' else idx[1]}",
                          st["kv_mismatch_examples"][0])
            # An ambiguous element stored beyond the values reachable within the tolerance.
            jdx = tuple(int(i) for i in np.argwhere(amb0 & (seen[-1] > 0))[0])
            engine[-1][jdx] = hi0[jdx] + np.uint16(1)
            engine_layout_dump(engine, kind).tofile(path)
            _, st = parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path,
                                            ambiguous_rel=rel)
            self.assertEqual((st["kv_mismatches"], st["kv_ambiguous_outside_bounds"]), (2, 1),
                             kind)
            # A file of the wrong size is an error, not a silent pass.
            engine_layout_dump(engine, kind)[:, :-1].tofile(path)
            with self.assertRaises(RuntimeError):
                parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path)


def test_seed() -> int:
    """STRATA_TEST_SEED when set (reproduces a run), else a fresh seed, printed."""
    env = os.environ.get("STRATA_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    print(f"[kimi tests] seed {seed} (STRATA_TEST_SEED={seed} reproduces)", file=sys.stderr)
    return seed


def kda_inputs(gen, B, T, H, D, dtype=torch.float64, strong=True):
    q = tb_model.l2norm(torch.randn(B, T, H, D, generator=gen, dtype=dtype)) * D ** -0.5
    k = tb_model.l2norm(torch.randn(B, T, H, D, generator=gen, dtype=dtype))
    v = torch.randn(B, T, H, D, generator=gen, dtype=dtype)
    g = -torch.rand(B, T, H, D, generator=gen, dtype=dtype) * 2
    if strong:  # strong per-channel decays: e^Gamma alone underflows, e^-Gamma overflows in f32
        g[..., 0] = -20.0
        g[:, ::3, :, 1] = -30.0
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    S0 = torch.randn(B, H, D, D, generator=gen, dtype=dtype)
    return q, k, v, g, beta, S0


class KdaTest(unittest.TestCase):
    """KDA (spec 2.2 / 2.3): the chunked training form against the per-token recurrence."""

    def test_chunked_equals_recurrent_f64(self):
        gen = torch.Generator().manual_seed(test_seed())
        for T in (1, 15, 16, 17, 100):
            q, k, v, g, beta, S0 = kda_inputs(gen, 2, T, 3, 16)
            for S in (None, S0):
                o1, s1 = tb_model.kda_recurrent(q, k, v, g, beta, S)
                for C in (16, 64, 5):
                    o2, s2 = tb_model.kda_chunked(q, k, v, g, beta, S, chunk=C)
                    self.assertLess((o1 - o2).abs().max().item(), 1e-11, (T, C))
                    self.assertLess((s1 - s2).abs().max().item(), 1e-11, (T, C))

    def test_chunked_f32_and_strong_decay(self):
        """f32 chunked vs the f64 recurrence within 2e-5 of the output scale, with decays of
        -80 per token on some channels, where e^-Gamma (the form the chunked code never uses)
        is inf in f32 after a few tokens."""
        gen = torch.Generator().manual_seed(test_seed())
        q, k, v, g, beta, S0 = kda_inputs(gen, 2, 100, 4, 32)
        g[..., 2] = -80.0
        self.assertTrue(torch.isinf(torch.exp(-g.float().cumsum(1))).any())  # the naive form
        ref, sref = tb_model.kda_recurrent(q, k, v, g, beta, S0)
        args = [x.float() for x in (q, k, v, g, beta, S0)]
        for C in (16, 64):
            o, s = tb_model.kda_chunked(*args[:5], args[5], chunk=C)
            self.assertTrue(torch.isfinite(o).all() and torch.isfinite(s).all())
            scale = ref.abs().max().item()
            self.assertLess((o.double() - ref).abs().max().item(), 2e-5 * scale, C)
            self.assertLess((s.double() - sref).abs().max().item(),
                            2e-5 * sref.abs().max().item(), C)

    def test_gradients_match(self):
        gen = torch.Generator().manual_seed(test_seed())
        ins = [x.requires_grad_() for x in kda_inputs(gen, 1, 23, 2, 8)]
        w = torch.randn(1, 23, 2, 8, generator=gen, dtype=torch.float64)
        grads = []
        for f in (lambda *a: tb_model.kda_recurrent(*a),
                  lambda *a: tb_model.kda_chunked(*a, chunk=8)):
            o, s = f(*ins)
            gs = torch.autograd.grad((o * w).sum() + s.sum(), ins)
            grads.append(gs)
        for a, b in zip(*grads):
            self.assertLess((a - b).abs().max().item(), 1e-9 * max(1.0, a.abs().max().item()))

    def test_decay_is_along_the_key_axis(self):
        """Spec check 7: beta = 0, g = 0 except -30 on key channel b: one step scales key row b
        of a nonzero state to ~0 and leaves every other row, and every column, as they were."""
        gen = torch.Generator().manual_seed(test_seed())
        q, k, v, g, beta, S0 = kda_inputs(gen, 1, 1, 2, 8)
        g.zero_()
        g[..., 3] = -30.0
        beta.zero_()
        for f in (tb_model.kda_recurrent, tb_model.kda_chunked):
            _, S = f(q, k, v, g, beta, S0)
            expect = S0.clone()
            expect[:, :, 3, :] *= math.exp(-30.0)
            self.assertLess((S - expect).abs().max().item(), 1e-12)

    def test_unit_lower_inverse(self):
        gen = torch.Generator().manual_seed(test_seed())
        for C in (1, 2, 5, 16, 64):
            L = torch.randn(3, C, C, generator=gen, dtype=torch.float64).tril(-1) * 0.5
            inv = tb_model.unit_lower_inverse(L)
            eye = torch.eye(C, dtype=torch.float64)
            self.assertLess(((eye + L) @ inv - eye).abs().max().item(), 1e-9, C)

    def test_conv_orientation(self):
        """Spec check 6: tap 3 is the current token (one-hot there: silu of the input), tap 0 the
        token 3 back (the first 3 outputs see the zeros before the sequence)."""
        conv = tb_model.ShortConv(5, 4)
        x = torch.randn(2, 9, 5, dtype=torch.float64)
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[:, 3] = 1.0
        conv.double()
        self.assertTrue(torch.allclose(conv(x), torch.nn.functional.silu(x)))
        with torch.no_grad():
            conv.weight.zero_()
            conv.weight[:, 0] = 1.0
        y = conv(x)
        self.assertTrue(torch.equal(y[:, :3], torch.zeros_like(y[:, :3])))
        self.assertTrue(torch.allclose(y[:, 3:], torch.nn.functional.silu(x[:, :-3])))

    def test_output_gate_is_sigmoid_after_the_norm(self):
        """Spec check 8: with the gate projection zeroed, y = 0.5 * RMSNorm_head(o) * w."""
        torch.manual_seed(1)
        c = tb_model.config_for("kimi")
        att = tb_model.KdaAttention(c).double()
        with torch.no_grad():
            att.g_b_proj.weight.zero_()
            att.o_norm.weight.uniform_(0.5, 1.5)
            att.o_proj.weight.copy_(torch.eye(c.d_model, dtype=torch.float64))
        x = torch.randn(1, 4, c.d_model, dtype=torch.float64)
        o = torch.randn(1, 4, c.kda_heads, c.kda_head_dim, dtype=torch.float64)
        rms = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.rms_eps)
        expect = (0.5 * rms * att.o_norm.weight).reshape(1, 4, -1)
        self.assertLess((att.output(x, o) - expect).abs().max().item(), 1e-12)


def kimi_engine_like_logits(model_dir: str, ids: np.ndarray, kv_bf16: bool = True) -> np.ndarray:
    """A float64 numpy forward of an exported KimiLinearForCausalLM directory, from the spec and
    the tensor names alone: per-token KDA (conv over the pre-conv projections with a 3-tap
    state, L2 norm, g = -exp(A_log) softplus(f_b f_a x + dt_bias), gated delta rule on a
    key-by-value state, per-head RMSNorm, sigmoid gate) and absorbed NoPE MLA over [c_hat ; k_pe]
    rows with attn_k_b / attn_v_b split from kv_b_proj and scale 1/sqrt(nope + rope)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    w = {k: v.astype(np.float64) for k, v in
         tb_hf.read_safetensors(os.path.join(model_dir, tb_hf.SAFETENSORS_NAME)).items()}
    eps = cfg["rms_norm_eps"]
    lac = cfg["linear_attn_config"]
    Hk, D, K = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    T = len(ids)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def bf16(x):
        if not kv_bf16:
            return x
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).double().numpy()

    def silu(x):
        return x / (1 + np.exp(-x))

    x = w["model.embed_tokens.weight"][ids]
    H = cfg["num_attention_heads"]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        h = rms(x, w[p + "input_layernorm.weight"])
        if (l + 1) in lac["kda_layers"]:
            conv_state = {n: np.zeros((K - 1, Hk * D)) for n in "qkv"}
            S = np.zeros((Hk, D, D))
            o = np.zeros((T, Hk, D))
            for t in range(T):
                xt = h[t]
                cv = {}
                for n in "qkv":
                    pre = w[a + f"{n}_proj.weight"] @ xt
                    window = np.concatenate([conv_state[n], pre[None]], 0)  # oldest first
                    cv[n] = silu((w[a + f"{n}_conv1d.weight"] * window.T).sum(-1))
                    conv_state[n] = window[1:]
                qh, kh, vh = (cv[n].reshape(Hk, D) for n in "qkv")
                qh = qh / np.sqrt((qh * qh).sum(-1, keepdims=True) + 1e-6) / math.sqrt(D)
                kh = kh / np.sqrt((kh * kh).sum(-1, keepdims=True) + 1e-6)
                z = w[a + "f_b_proj.weight"] @ (w[a + "f_a_proj.weight"] @ xt) + w[a + "dt_bias"]
                sp = np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20))))
                g = -np.exp(w[a + "A_log"].reshape(Hk, 1)) * sp.reshape(Hk, D)
                beta = 1 / (1 + np.exp(-(w[a + "b_proj.weight"] @ xt)))
                for hh in range(Hk):
                    S[hh] *= np.exp(g[hh])[:, None]
                    delta = beta[hh] * (vh[hh] - S[hh].T @ kh[hh])
                    S[hh] += np.outer(kh[hh], delta)
                    o[t, hh] = S[hh].T @ qh[hh]
            gate = (h @ w[a + "g_a_proj.weight"].T) @ w[a + "g_b_proj.weight"].T
            y = rms(o, w[a + "o_norm.weight"]) / (1 + np.exp(-gate.reshape(T, Hk, D)))
            x = x + y.reshape(T, Hk * D) @ w[a + "o_proj.weight"].T
        else:
            dc, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
            nope, dv = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            q = (h @ w[a + "q_proj.weight"].T).reshape(T, H, nope + dr)
            kva = h @ w[a + "kv_a_proj_with_mqa.weight"].T
            rows = bf16(np.concatenate([rms(kva[:, :dc], w[a + "kv_a_layernorm.weight"]),
                                        kva[:, dc:]], -1))
            kvb = w[a + "kv_b_proj.weight"].reshape(H, nope + dv, dc)
            q_abs = np.concatenate([np.einsum("hnc,thn->thc", kvb[:, :nope], q[..., :nope]),
                                    q[..., nope:]], -1)
            s = np.einsum("thk,uk->htu", q_abs, rows) / math.sqrt(nope + dr)
            s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("htu,uc->thc", s, rows[:, :dc])
            o = np.einsum("hvc,thc->thv", kvb[:, nope:], att).reshape(T, H * dv)
            x = x + o @ w[a + "o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gg = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gg) * u) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def kimi_expected_shapes(cfg: dict) -> dict:
    """HF tensor names and torch shapes of spec 2.1 / 3.1 / 4.2 for this config (all-dense)."""
    d, V = cfg["hidden_size"], cfg["vocab_size"]
    lac = cfg["linear_attn_config"]
    Hk, D, K = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    H, dc, dr = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, dv, ff = cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["intermediate_size"]
    shapes = {"model.embed_tokens.weight": [V, d], "lm_head.weight": [V, d],
              "model.norm.weight": [d]}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        shapes[p + "input_layernorm.weight"] = [d]
        shapes[p + "post_attention_layernorm.weight"] = [d]
        shapes[p + "mlp.gate_proj.weight"] = [ff, d]
        shapes[p + "mlp.up_proj.weight"] = [ff, d]
        shapes[p + "mlp.down_proj.weight"] = [d, ff]
        if (l + 1) in lac["kda_layers"]:
            for n in "qkv":
                shapes[a + f"{n}_proj.weight"] = [Hk * D, d]
                shapes[a + f"{n}_conv1d.weight"] = [Hk * D, K]
            shapes.update({a + "f_a_proj.weight": [D, d], a + "f_b_proj.weight": [Hk * D, D],
                           a + "A_log": [1, 1, Hk, 1], a + "dt_bias": [Hk * D],
                           a + "b_proj.weight": [Hk, d], a + "g_a_proj.weight": [D, d],
                           a + "g_b_proj.weight": [Hk * D, D], a + "o_norm.weight": [D],
                           a + "o_proj.weight": [d, Hk * D]})
        else:
            shapes.update({a + "q_proj.weight": [H * (nope + dr), d],
                           a + "kv_a_proj_with_mqa.weight": [dc + dr, d],
                           a + "kv_a_layernorm.weight": [dc],
                           a + "kv_b_proj.weight": [H * (nope + dv), dc],
                           a + "o_proj.weight": [d, H * dv]})
    return shapes


class KimiExportTest(Tmp):
    def test_names_shapes_config(self):
        d = os.path.join(self.tmp, "kimi")
        m = tb_export.random_model("kimi", 3)
        tb_hf.export(m, d)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["architectures"], ["KimiLinearForCausalLM"])
        self.assertEqual(cfg["model_type"], "kimi_linear")
        self.assertEqual(cfg["linear_attn_config"], {
            "kda_layers": [1, 2], "full_attn_layers": [3], "num_heads": 4, "head_dim": 32,
            "short_conv_kernel_size": 4})
        self.assertEqual((cfg["hidden_size"], cfg["num_hidden_layers"], cfg["kv_lora_rank"],
                          cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"],
                          cfg["num_attention_heads"], cfg["intermediate_size"]),
                         (128, 3, 64, 32, 16, 32, 4, 256))
        self.assertIsNone(cfg["q_lora_rank"])
        self.assertTrue(cfg["mla_use_nope"])
        self.assertEqual(cfg["first_k_dense_replace"], 3)  # every FFN dense: no expert tensors
        self.assertEqual(cfg["moe_router_activation_func"], "sigmoid")
        self.assertFalse(cfg["tie_word_embeddings"])
        self.assertEqual(cfg["rms_norm_eps"], 1e-5)
        for k in ("num_experts", "num_experts_per_token", "num_shared_experts",
                  "moe_intermediate_size", "moe_renormalize", "routed_scaling_factor",
                  "moe_layer_freq", "num_key_value_heads", "head_dim", "vocab_size",
                  "max_position_embeddings", "bos_token_id"):
            self.assertIn(k, cfg)
        t = tb_hf.read_safetensors(os.path.join(d, tb_hf.SAFETENSORS_NAME))
        self.assertEqual({k: list(v.shape) for k, v in t.items()}, kimi_expected_shapes(cfg))
        self.assertEqual(len(t), 3 + 3 * 2 + 2 * 15 + 5 + 3 * 3)
        # Round trip.
        m2 = tb_hf.load(d)
        self.assertEqual(m2.config, tb_hf.config_from_hf(cfg))
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, m2.state_dict()[k]), k)

    def test_bad_configs(self):
        base = tb_hf.hf_config(tb_model.config_for("kimi"))
        bad = json.loads(json.dumps(base))
        bad["linear_attn_config"]["full_attn_layers"] = [2, 3]
        with self.assertRaisesRegex(ValueError, "partition"):
            tb_hf.config_from_hf(bad)
        bad = json.loads(json.dumps(base))
        bad["first_k_dense_replace"] = 1
        with self.assertRaisesRegex(ValueError, "first_k_dense_replace"):
            tb_hf.config_from_hf(bad)

    def test_forward_vs_f64_per_token_reference(self):
        """The PyTorch model (chunked KDA) against kimi_engine_like_logits on a needle example,
        with and without the bf16 rounding of the MLA cache rows."""
        d = os.path.join(self.tmp, "kimi")
        tb_hf.export(tb_export.random_model("kimi", test_seed() % 1000, init_scale=4.0), d)
        model = tb_hf.load(d)
        ids, _, _ = tb_data.make_example(tb_data.Corpus.synthetic(5), 70,
                                         np.random.default_rng(2))
        x = torch.from_numpy(ids[None].astype(np.int64))
        refs = {b: kimi_engine_like_logits(d, ids, b) for b in (False, True)}
        # With the bf16 rounding, an f32 row element (ours) and its f64 twin (the reference)
        # that straddle a bf16 rounding boundary round one bf16 ulp (2^-8 relative) apart,
        # so 1e-4 of the scale is f32 rounding's bound only without it (seed 551: 1.7e-4).
        # With it, the check is that the rounding is applied where the reference applies it:
        # the difference stays under half the rounding's own effect on the logits (62 seeds:
        # at most 0.19 of it; a missing or misplaced rounding leaves about all of it).
        effect = np.abs(refs[True] - refs[False]).max()
        for kv_bf16 in (False, True):
            with torch.no_grad():
                ours = model(x, kv_bf16=kv_bf16)[0].double().numpy()
            ref = refs[kv_bf16]
            scale = np.abs(ref).max()
            self.assertGreater(scale, 1.0)
            bound = 0.5 * effect if kv_bf16 else 1e-4 * scale
            self.assertLess(np.abs(ours - ref).max(), bound, kv_bf16)

    def test_engine_kv_rows_are_the_mla_layers(self):
        """parity.py reads a kimi --dump-kv file as the MLA layers only (KDA layers have no KV
        cache): a dump of the reference's own rows gives 0 mismatches and the same logits."""
        d = os.path.join(self.tmp, "kimi")
        tb_hf.export(tb_export.random_model("kimi", 11, init_scale=4.0), d)
        model = tb_hf.load(d)
        ids, _, _ = tb_data.make_example(tb_data.Corpus.synthetic(4), 40,
                                         np.random.default_rng(3))
        x = torch.from_numpy(ids[None].astype(np.int64))
        rows = []
        orig = tb_model.round_bf16

        def record(t):
            rows.append(parity.bf16_bits(t.detach().numpy()))
            return orig(t)

        tb_model.round_bf16 = record
        try:
            with torch.no_grad():
                own = model(x, kv_bf16=True)[0].numpy()
        finally:
            tb_model.round_bf16 = orig
        self.assertEqual(len(rows), 1)  # one MLA layer
        path = os.path.join(self.tmp, "kimi.kv")
        np.stack([r[0] for r in rows]).astype("<u2").tofile(path)
        got, st = parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path)
        self.assertEqual(st["kv_mismatches"], 0)
        self.assertEqual(st["kv_elements"], 40 * 80)
        self.assertEqual([p["elements"] for p in st["kv_per_layer"]], [0, 0, 40 * 80])
        np.testing.assert_array_equal(got, own)
        np.fromfile(path, dtype="<u2")[:-80].tofile(path)  # one row short: an error
        with self.assertRaisesRegex(RuntimeError, "1 cached layers"):
            parity.reference_logits(d, ids, kv_bf16=True, engine_kv=path)


class KimiTrainResumeTest(Tmp):
    def test_checkpoint_resume_and_signal_stop(self):
        try:
            tb_data.load_kjv_text()
        except RuntimeError as e:
            self.skipTest(str(e))
        out = os.path.join(self.tmp, "run")
        common = [sys.executable, os.path.join(HERE, "train.py"), "--model", "kimi", "--out",
                  out, "--tokens-per-step", "256", "--stages", "32,64", "--eval-every-s", "2",
                  "--ckpt-every-s", "2", "--final-eval", "64:8", "--no-export"]
        r = subprocess.run(common + ["--budget-min", str(4 / 60)], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "summary.json")) as f:
            s1 = json.load(f)
        self.assertGreater(s1["steps"], 0)
        # A resumed session stopped by SIGTERM: it checkpoints and exits 0 without a summary.
        os.remove(os.path.join(out, "summary.json"))
        proc = subprocess.Popen(common + ["--budget-min", "10"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if "resumed at step" in line:
                self.assertIn(f"resumed at step {s1['steps']}", line)
                break
        import time
        time.sleep(3)
        proc.terminate()
        rest, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, err)
        self.assertIn("stopped by signal", rest)
        self.assertFalse(os.path.exists(os.path.join(out, "summary.json")))
        ck = torch.load(os.path.join(out, "ckpt.pt"), map_location="cpu")
        stopped_at = ck["state"]["step"]
        self.assertGreaterEqual(stopped_at, s1["steps"])
        r = subprocess.run(common + ["--budget-min", str(ck["state"]["train_s"] / 60 + 3 / 60)],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"resumed at step {stopped_at}", r.stdout)
        with open(os.path.join(out, "summary.json")) as f:
            s2 = json.load(f)
        self.assertGreater(s2["steps"], stopped_at)
        steps = []
        with open(os.path.join(out, "log.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if rec["t"] == "step":
                    steps.append(rec["step"])
        self.assertEqual(steps, list(range(1, s2["steps"] + 1)))  # no gaps, no repeats



def strata_with_commands():
    strata = parity.find_strata(os.environ.get("STRATA_BIN"))
    if strata is None:
        return None, "no strata binary (set STRATA_BIN or build build/release/strata)"
    for cmd in ("convert", "logits"):
        r = subprocess.run([strata, cmd, "--help"], capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"{strata} has no working `{cmd}` command yet"
    return strata, ""


class EngineParityTest(Tmp):
    def assert_engine_kv_path(self, json_path: str, name: str):
        """The run compared against the engine's dumped cache, which matched the reference's
        rounding bit for bit outside the ambiguous elements."""
        with open(json_path) as f:
            res = json.load(f)
        self.assertEqual(res["reference_cache"], "engine-kv", name)
        self.assertEqual(res["kv_mismatches"], 0, name)
        kimi = "kimi" in name
        per_token = 80 if "mla" in name or kimi or name in ("nope", "rope") else 128
        cached_layers = 1 if kimi else 2  # the kimi testbed: KDA, KDA, MLA
        self.assertEqual(res["kv_elements"], cached_layers * res["n_tokens"] * per_token, name)
        self.assertLess(res["kv_ambiguous"], res["kv_elements"] // 20, name)  # a few %
        self.assertLessEqual(res["max_abs_diff"], res["tol"], name)

    def test_parity_random_models(self):
        strata, why = strata_with_commands()
        if strata is None:
            self.skipTest(why)
        extra = os.environ.get("STRATA_CONVERT_ARGS", "--dtype f32").split()
        for kind in ("nope", "rope", "gqa"):
            d = os.path.join(self.tmp, kind)
            tb_hf.export(tb_export.random_model(kind, 21, init_scale=4.0), d)
            gguf = os.path.join(self.tmp, kind + ".gguf")
            r = subprocess.run([strata, "convert", d, "-o", gguf] + extra, capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 0, f"convert {kind}: {r.stderr}")
            out = os.path.join(self.tmp, kind + ".json")
            rc = parity.main(["--model-dir", d, "--gguf", gguf, "--strata", strata,
                              "--json", out])
            self.assertEqual(rc, 0, f"parity failed for {kind}")
            self.assert_engine_kv_path(out, kind)

    def test_parity_random_kimi(self):
        """A random Kimi-Linear-shaped testbed through `strata convert` (HF
        KimiLinearForCausalLM) and `strata logits`: skipped while the engine's converter does not
        know the architecture yet (the message must name it), a failure otherwise."""
        strata, why = strata_with_commands()
        if strata is None:
            self.skipTest(why)
        d = os.path.join(self.tmp, "kimi")
        tb_hf.export(tb_export.random_model("kimi", 21, init_scale=4.0), d)
        gguf = os.path.join(self.tmp, "kimi.gguf")
        r = subprocess.run([strata, "convert", d, "-o", gguf, "--dtype", "f32"],
                           capture_output=True, text=True)
        if r.returncode != 0 and "KimiLinearForCausalLM" in r.stderr + r.stdout \
                and not os.environ.get("STRATA_REQUIRE_KIMI"):
            self.skipTest("strata convert does not support KimiLinearForCausalLM yet: "
                          + (r.stderr.strip() or r.stdout.strip())[:200])
        self.assertEqual(r.returncode, 0, f"convert kimi: {r.stderr}")
        out = os.path.join(self.tmp, "kimi.json")
        rc = parity.main(["--model-dir", d, "--gguf", gguf, "--strata", strata, "--json", out])
        self.assertEqual(rc, 0, "parity failed for kimi")
        self.assert_engine_kv_path(out, "kimi")

    def test_parity_shipped_models(self):
        """The models in models/: the GGUF is exactly what `strata convert --dtype f32` makes of
        the shipped HF export, and the engine's logits match PyTorch's on it (<= 1e-3)."""
        strata, why = strata_with_commands()
        if strata is None:
            self.skipTest(why)
        models = os.path.join(REPO, "models")
        names = sorted(n for n in os.listdir(os.path.join(models, "hf"))
                       if os.path.isfile(os.path.join(models, "hf", n, "config.json")))
        # kimi-linear (the hybrid testbed) joins once it is shipped with its GGUF.
        self.assertEqual([n for n in names if n != "kimi-linear"],
                         ["gqa", "nope-mla", "rope-mla"])
        for name in names:
            d = os.path.join(models, "hf", name)
            gguf = os.path.join(self.tmp, name + ".gguf")
            r = subprocess.run([strata, "convert", d, "-o", gguf, "--dtype", "f32"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"convert {name}: {r.stderr}")
            with open(gguf, "rb") as a, open(os.path.join(models, name + ".gguf"), "rb") as b:
                self.assertTrue(a.read() == b.read(),
                                f"models/{name}.gguf is not the conversion of models/hf/{name}")
            out = os.path.join(self.tmp, name + ".json")
            rc = parity.main(["--model-dir", d, "--gguf", gguf, "--strata", strata,
                              "--json", out])
            self.assertEqual(rc, 0, f"parity failed for the shipped {name}")
            self.assert_engine_kv_path(out, name)

    def test_parity_f32_cache_shipped_models(self):
        """`--kv-type f32` (issue 19 defect 13): with an f32 cache on both sides the shipped
        models' logits match to 1e-4 (measured ~2e-5), where the default bf16 cache stands
        5e-2 to 8e-2 from the unrounded reference."""
        strata, why = strata_with_commands()
        if strata is None:
            self.skipTest(why)
        for name in ("gqa", "nope-mla", "rope-mla"):
            out = os.path.join(self.tmp, name + "_f32.json")
            rc = parity.main(["--model-dir", os.path.join(REPO, "models", "hf", name),
                              "--gguf", os.path.join(REPO, "models", name + ".gguf"),
                              "--strata", strata, "--kv-type", "f32", "--tol", "1e-4",
                              "--json", out])
            self.assertEqual(rc, 0, f"f32-cache parity failed for the shipped {name}")
            with open(out) as f:
                res = json.load(f)
            self.assertEqual(res["kv_type"], "f32")
            self.assertLessEqual(res["max_abs_diff_vs_f32_cache_reference"], 1e-4, name)


if __name__ == "__main__":
    unittest.main()
