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
        per_token = 80 if "mla" in name or name in ("nope", "rope") else 128  # testbed dims
        self.assertEqual(res["kv_elements"], 2 * res["n_tokens"] * per_token, name)
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

    def test_parity_shipped_models(self):
        """The models in models/: the GGUF is exactly what `strata convert --dtype f32` makes of
        the shipped HF export, and the engine's logits match PyTorch's on it (<= 1e-3)."""
        strata, why = strata_with_commands()
        if strata is None:
            self.skipTest(why)
        models = os.path.join(REPO, "models")
        names = sorted(n for n in os.listdir(os.path.join(models, "hf"))
                       if os.path.isfile(os.path.join(models, "hf", n, "config.json")))
        self.assertEqual(names, ["gqa", "nope-mla", "rope-mla"])
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
