#!/usr/bin/python3
"""Logit parity between the PyTorch testbed model and Strata on a fixed 512-token sequence.

  /usr/bin/python3 tools/testbed/parity.py --model-dir RUN/hf --gguf /tmp/m.gguf \
      [--strata build/release/strata] [--tol 1e-3] [--no-engine-kv]

Strata's side is `strata logits -m FILE.gguf --tokens TOKENS.txt --out LOGITS.f32 --dump-kv
KV.bin`, which writes raw little-endian f32 [n_tokens, vocab] (logits at every position of the
given ids, no BOS added: the sequence already starts with BOS = 0) and the engine's bf16 KV cache
after the run (layout: `strata logits --help`, tools/testbed/README.md). TOKENS.txt holds
whitespace-separated decimal ids (written one per line here). Everything but the cache is f32, so
the GGUF must hold F32 weights (`strata convert DIR -o FILE.gguf --dtype f32`); with F16 weights
expect ~1e-2 differences. `--kv-type f32` runs the engine with an f32 KV cache (`strata logits
--kv-type f32`) and compares it with the reference whose cache is not rounded at all.

The reference rounds the cache to bf16 where the engine stores it (tb_model kv_bf16=True). The
two f32 values before that rounding differ by a few 1e-6 of the element's scale (summation order;
scale = max(|x|, RMS of x's row segment: MLA c_hat or r, GQA one head's K or V row), so an
element that close to a bf16 rounding midpoint may round the other way in each, and one such flip
moves a logit by ~1e-3. So, by default, at every *ambiguous* element (a midpoint lies within
--ambiguous-rel x scale of the reference's f32 value x) the reference uses the engine's dumped
bf16 value, which must lie between the roundings of x -/+ that distance; everywhere else it uses
its own rounding and the engine's value must equal it bit for bit: any mismatch is a failure of
its own, whatever the logits say. --no-engine-kv keeps the reference's own rounding everywhere
(no dump, no check).

Exit status: 0 when max |logit difference| <= tol and the cache check passes, 1 when not, 2 on
usage or tool errors.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SEED = 20240
DEFAULT_LEN = 512
DEFAULT_AMBIGUOUS_REL = 1e-5


def find_strata(explicit: str | None) -> str | None:
    cands = [explicit, os.environ.get("STRATA_BIN"),
             os.path.join(REPO, "build", "release", "strata"),
             os.path.join(REPO, "build", "release", "cli", "strata"),
             os.path.join(REPO, "build", "asan", "cli", "strata"), shutil.which("strata")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def fixed_tokens(length: int = DEFAULT_LEN, seed: int = DEFAULT_SEED) -> tuple[np.ndarray, str]:
    """The fixed parity sequence: one needle example of `length` ids (KJV filler from the `bible`
    program; a seeded synthetic filler when the program is missing)."""
    import tb_data
    try:
        corpus, source = tb_data.Corpus.kjv(), "kjv"
    except RuntimeError:
        corpus, source = tb_data.Corpus.synthetic(seed), "synthetic (no `bible` program)"
    ids, _, _ = tb_data.make_example(corpus, length, np.random.default_rng([seed]))
    return ids, source


# --- minimal GGUF reader (metadata and tensor types only), for diagnostics -------------------
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_GGML_TYPES = {0: "F32", 1: "F16", 8: "Q8_0", 30: "BF16"}


def gguf_summary(path: str) -> dict:
    """{'kv': {key: scalar or str}, 'tensor_types': {name: type name}} (arrays are skipped)."""
    with open(path, "rb") as f:
        buf = f.read(8 << 20)  # the metadata of a testbed GGUF is far smaller
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    _version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, pos)
    pos += 20

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def rd_str():
        nonlocal pos
        n = rd("<Q")
        s = buf[pos:pos + n].decode("utf-8", errors="replace")
        pos += n
        return s

    def rd_val(t):
        if t in _GGUF_SCALARS:
            return rd(_GGUF_SCALARS[t])
        if t == 8:
            return rd_str()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            for _ in range(n):
                rd_val(et)
            return f"<array of {n}>"
        raise ValueError(f"{path}: unknown GGUF value type {t}")

    kv = {}
    for _ in range(n_kv):
        k = rd_str()
        kv[k] = rd_val(rd("<I"))
    types = {}
    for _ in range(n_tensors):
        name = rd_str()
        nd = rd("<I")
        pos += 8 * nd
        t = rd("<I")
        pos += 8
        types[name] = _GGML_TYPES.get(t, f"type{t}")
    return {"kv": kv, "tensor_types": types}


def run_strata_logits(strata: str, gguf: str, ids: np.ndarray, workdir: str,
                      vocab: int, dump_kv: bool = False,
                      kv_type: str = "bf16") -> tuple[np.ndarray, str | None]:
    """(logits [n, vocab] f32, path of the --dump-kv file or None)."""
    tok_path = os.path.join(workdir, "tokens.txt")
    out_path = os.path.join(workdir, "logits.f32")
    kv_path = os.path.join(workdir, "kv.bin") if dump_kv else None
    with open(tok_path, "w") as f:
        f.write("\n".join(str(int(i)) for i in ids) + "\n")
    cmd = [strata, "logits", "-m", gguf, "--tokens", tok_path, "--out", out_path]
    if kv_path:
        cmd += ["--dump-kv", kv_path]
    if kv_type != "bf16":
        cmd += ["--kv-type", kv_type]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit status {r.returncode}:\n"
                           f"{r.stderr.strip() or r.stdout.strip()}")
    raw = np.fromfile(out_path, dtype="<f4")
    if raw.size != len(ids) * vocab:
        raise RuntimeError(f"{out_path}: {raw.size} floats, expected {len(ids)} x {vocab} = "
                           f"{len(ids) * vocab}")
    return raw.reshape(len(ids), vocab).astype(np.float32), kv_path


def engine_kv_rows(path: str, c, n_tokens: int) -> list[list[np.ndarray]]:
    """The engine's --dump-kv file as bf16 bit patterns (uint16) for the model of tb_model.Config
    c (a Kimi Linear model: the file holds its MLA layers only, and a KDA layer's entry is []),
    per layer in the reference's
    tensor layouts and in the order the reference rounds them: MLA [rows [1, T, d_c + d_r]];
    GQA [K [1, G, T, hd] in HF dim order, V [1, G, T, hd]].

    File: little-endian u16, layer after layer, n_tokens rows per layer. MLA row = [c_hat ; r];
    GQA row = [K head 0 .. K head G-1 ; V head 0 .. V head G-1], K in the engine's dim order:
    the converter permutes llama q/k rows, so engine dim 2i+s of a head is HF dim s*hd/2 + i."""
    raw = np.fromfile(path, dtype="<u2")
    mla_rows = c.is_mla or c.is_kimi
    if mla_rows:
        width = c.kv_lora_rank + c.qk_rope_head_dim
    else:
        width = 2 * c.n_kv_heads * c.head_dim
    # Kimi Linear: only the MLA layers have a KV cache (KDA layers hold a fixed-size f32
    # recurrent state that is not dumped), so the file holds the MLA layers in layer order.
    cached = c.mla_layers() if c.is_kimi else list(range(c.n_layers))
    expect = len(cached) * n_tokens * width
    if raw.size != expect:
        raise RuntimeError(f"{path}: {raw.size} bf16 values, expected {len(cached)} cached "
                           f"layers x {n_tokens} tokens x {width} = {expect}")
    rows = raw.reshape(len(cached), n_tokens, width)
    out = []
    for l in range(c.n_layers):
        if l not in cached:
            out.append([])  # a KDA layer: nothing is rounded to bf16 there
            continue
        i = cached.index(l)
        if mla_rows:
            out.append([np.ascontiguousarray(rows[i][None])])
            continue
        G, hd, T = c.n_kv_heads, c.head_dim, n_tokens
        k = rows[i, :, :G * hd].reshape(T, G, hd // 2, 2).swapaxes(-1, -2).reshape(T, G, hd)
        v = rows[i, :, G * hd:].reshape(T, G, hd)
        out.append([np.ascontiguousarray(k.transpose(1, 0, 2)[None]),
                    np.ascontiguousarray(v.transpose(1, 0, 2)[None])])
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bit patterns (as torch's .to(torch.bfloat16))."""
    import torch
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    b = np.asarray(bits, dtype=np.uint16)
    return (b.reshape(-1).astype(np.uint32) << 16).view(np.float32).reshape(b.shape)


def element_scale(x: np.ndarray, split: int | None) -> np.ndarray:
    """max(|x|, RMS of x's row segment) in f64, the scale of an element's f32 error: a dot
    product's rounding error follows the size of its terms, not of its (possibly cancelling)
    result, so a small element of a large row carries its row's absolute error. Segments: the
    last axis, cut at `split` (MLA: c_hat | r; GQA: one head's K or V row, split None)."""
    x = np.asarray(x, dtype=np.float64)
    parts = [x] if split is None else [x[..., :split], x[..., split:]]
    rms = np.concatenate([np.broadcast_to(np.sqrt((p * p).mean(-1, keepdims=True)), p.shape)
                          for p in parts], -1)
    return np.maximum(np.abs(x), rms)


def rounding_bounds(x: np.ndarray, rel: float, split: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ambiguous, lo, hi): lo, hi = the bf16 roundings (bit patterns) of x -/+ tol, tol = rel *
    element_scale(x), widened outward by an f32 ulp; an element is ambiguous when they differ,
    i.e. a bf16 rounding midpoint lies within tol of x, so an f32 value within tol of x may round
    to any bf16 value in [lo, hi]."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    x64 = x32.astype(np.float64)
    tol = rel * element_scale(x64, split)
    lo = np.nextafter((x64 - tol).astype(np.float32), np.float32(-np.inf))
    hi = np.nextafter((x64 + tol).astype(np.float32), np.float32(np.inf))
    lo_b, hi_b = bf16_bits(lo), bf16_bits(hi)
    return lo_b != hi_b, lo_b, hi_b


class EngineKvRounding:
    """Replaces tb_model.round_bf16 during one forward: the reference's own bf16 rounding, except
    at ambiguous elements (rounding_bounds), which take the engine's dumped value; counts and
    records mismatches (a non-ambiguous element the engine stored otherwise, or an ambiguous one
    it stored outside [lo, hi])."""

    MAX_EXAMPLES = 5

    def __init__(self, model, engine: list[list[np.ndarray]], rel: float):
        self.c = model.config
        self.split = self.c.kv_lora_rank if (self.c.is_mla or self.c.is_kimi) else None
        self.engine, self.rel = engine, rel
        self.layer, self.slot = None, 0
        self.elements = self.ambiguous = self.flipped = 0
        self.mismatches = self.ambiguous_outside = 0
        self.per_layer = [{"elements": 0, "ambiguous": 0, "flipped": 0, "mismatches": 0}
                          for _ in engine]
        self.examples: list[str] = []
        self._handles = []
        self._saved = None
        for l, block in enumerate(model.model.layers):
            self._handles.append(block.self_attn.register_forward_pre_hook(self._pre(l)))
            self._handles.append(block.self_attn.register_forward_hook(self._post(l)))

    def _pre(self, l):
        def hook(_module, _inputs):
            self.layer, self.slot = l, 0
        return hook

    def _post(self, l):
        def hook(_module, _inputs, _output):
            if self.slot != len(self.engine[l]):
                raise RuntimeError(f"layer {l}: the reference rounded {self.slot} cache tensors, "
                                   f"expected {len(self.engine[l])}")
            self.layer = None
        return hook

    def __enter__(self):
        import tb_model
        self._saved = tb_model.round_bf16
        tb_model.round_bf16 = self.round
        return self

    def __exit__(self, *exc):
        import tb_model
        tb_model.round_bf16 = self._saved
        for h in self._handles:
            h.remove()
        return False

    def _name(self, l, slot, idx):
        if self.c.is_mla or self.c.is_kimi:
            _, t, j = idx
            part = "c_hat" if j < self.c.kv_lora_rank else "r"
            return f"layer {l} token {t} row dim {j} ({part})"
        _, g, t, j = idx
        return f"layer {l} token {t} {'KV'[slot]} head {g} dim {j} (HF order)"

    def round(self, x):
        import torch
        l, slot = self.layer, self.slot
        if l is None or slot >= len(self.engine[l]):
            raise RuntimeError("round_bf16 called outside the expected cache rounding points")
        self.slot += 1
        eng = self.engine[l][slot]
        xs = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        if xs.shape != eng.shape:
            raise RuntimeError(f"layer {l}: reference cache tensor {xs.shape} vs the engine's "
                               f"{eng.shape}")
        own = bf16_bits(xs)
        amb, lo, hi = rounding_bounds(xs, self.rel, self.split)
        ef = bf16_to_f32(eng)
        outside = amb & ((ef < bf16_to_f32(lo)) | (ef > bf16_to_f32(hi)) | np.isnan(ef))
        bad = (~amb & (eng != own)) | outside
        counts = {"elements": int(xs.size), "ambiguous": int(amb.sum()),
                  "flipped": int((amb & (eng != own)).sum()), "mismatches": int(bad.sum())}
        for k, v in counts.items():
            self.per_layer[l][k] += v
            setattr(self, k, getattr(self, k) + v)
        self.ambiguous_outside += int(outside.sum())
        if bad.any() and len(self.examples) < self.MAX_EXAMPLES:
            scale = element_scale(xs, self.split)
            for idx in np.argwhere(bad)[:self.MAX_EXAMPLES - len(self.examples)]:
                idx = tuple(int(i) for i in idx)
                v, o, e = float(xs[idx]), float(bf16_to_f32(own[idx])), float(ef[idx])
                self.examples.append(
                    f"{self._name(l, slot, idx)}: reference f32 {v!r} rounds to {o:.9g}, engine "
                    f"stored {e:.9g}; |x - (rounded + stored)/2| = "
                    f"{abs(v - (o + e) / 2) / scale[idx]:.2e} x scale {scale[idx]:.3g} (ambiguous "
                    f"within {self.rel:g} x scale)")
        chosen = np.where(amb, eng, own)
        return torch.from_numpy(bf16_to_f32(chosen)).to(x.device)

    def stats(self) -> dict:
        return {"kv_elements": self.elements, "kv_ambiguous": self.ambiguous,
                "kv_ambiguous_taken_from_engine_differing": self.flipped,
                "kv_mismatches": self.mismatches,
                "kv_ambiguous_outside_bounds": self.ambiguous_outside,
                "kv_ambiguous_rel": self.rel, "kv_per_layer": self.per_layer,
                "kv_mismatch_examples": self.examples}


def reference_logits(model_dir: str, ids: np.ndarray, kv_bf16: bool,
                     engine_kv: str | None = None, ambiguous_rel: float = DEFAULT_AMBIGUOUS_REL
                     ) -> tuple[np.ndarray, dict | None]:
    """The PyTorch logits [n, vocab]; with engine_kv (a --dump-kv file, kv_bf16 must be True)
    the cache rounding takes the engine's value at ambiguous elements, and the second value is
    the cache check's figures (EngineKvRounding.stats), else None."""
    import torch
    import tb_hf
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = tb_hf.load(model_dir)
    x = torch.from_numpy(ids[None].astype(np.int64))
    with torch.no_grad():
        if engine_kv is None:
            return model(x, kv_bf16=kv_bf16)[0].numpy().astype(np.float32), None
        if not kv_bf16:
            raise ValueError("engine_kv needs kv_bf16=True")
        rows = engine_kv_rows(engine_kv, model.config, len(ids))
        with EngineKvRounding(model, rows, ambiguous_rel) as sub:
            lo = model(x, kv_bf16=True)[0].numpy().astype(np.float32)
        return lo, sub.stats()


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    d = np.abs(ref.astype(np.float64) - got.astype(np.float64))
    pos, tok = np.unravel_index(int(np.argmax(d)), d.shape)
    return {"max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "worst_position": int(pos), "worst_token": int(tok),
            "argmax_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
            "max_abs_logit": float(np.abs(ref).max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-dir", required=True, help="exported HF directory (config.json, "
                   "model.safetensors)")
    p.add_argument("--gguf", required=True, help="the GGUF converted from --model-dir")
    p.add_argument("--strata", help="strata binary (default: $STRATA_BIN, build/release/strata, "
                   "build/release/cli/strata, PATH)")
    p.add_argument("--tol", type=float, default=1e-3, help="max abs logit difference (1e-3)")
    p.add_argument("--len", type=int, default=DEFAULT_LEN)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--ambiguous-rel", type=float, default=DEFAULT_AMBIGUOUS_REL,
                   help="a reference cache value x is ambiguous when a bf16 rounding midpoint "
                   "lies within this x max(|x|, RMS of x's row segment) of x "
                   f"({DEFAULT_AMBIGUOUS_REL:g})")
    p.add_argument("--no-engine-kv", action="store_true",
                   help="diagnosis: the reference's own bf16 rounding everywhere (no --dump-kv, "
                   "no cache check)")
    p.add_argument("--kv-type", choices=["bf16", "f32"], default="bf16",
                   help="the engine's KV cache type (strata --kv-type); f32: compared with the "
                        "reference whose cache is not rounded, no cache dump or check")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--keep", help="keep tokens.txt, logits.f32 and kv.bin in this directory")
    a = p.parse_args(argv)

    try:
        import torch  # noqa: F401
    except ImportError:
        print("parity: torch is not importable (use /usr/bin/python3 with python3-torch)",
              file=sys.stderr)
        return 2
    if not 0 <= a.ambiguous_rel <= 1e-2:
        print(f"parity: --ambiguous-rel {a.ambiguous_rel:g} must be in [0, 1e-2]",
              file=sys.stderr)
        return 2
    strata = find_strata(a.strata)
    if strata is None:
        print("parity: no strata binary (pass --strata or set STRATA_BIN)", file=sys.stderr)
        return 2
    for path in (os.path.join(a.model_dir, "config.json"), a.gguf):
        if not os.path.exists(path):
            print(f"parity: {path} does not exist", file=sys.stderr)
            return 2
    with open(os.path.join(a.model_dir, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])

    use_engine_kv = not a.no_engine_kv and a.kv_type == "bf16"
    ids, source = fixed_tokens(a.len, a.seed)
    workdir = a.keep or tempfile.mkdtemp(prefix="strata-parity-")
    os.makedirs(workdir, exist_ok=True)
    try:
        try:
            got, kv_path = run_strata_logits(strata, a.gguf, ids, workdir, vocab,
                                             dump_kv=use_engine_kv, kv_type=a.kv_type)
        except (RuntimeError, OSError) as e:
            print(f"parity: {e}", file=sys.stderr)
            return 2
        ref_own, _ = reference_logits(a.model_dir, ids, kv_bf16=True)
        kv = None
        if use_engine_kv:
            try:
                ref, kv = reference_logits(a.model_dir, ids, kv_bf16=True, engine_kv=kv_path,
                                           ambiguous_rel=a.ambiguous_rel)
            except RuntimeError as e:
                print(f"parity: {e}", file=sys.stderr)
                return 2
        else:
            ref = ref_own
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ref_f32, _ = reference_logits(a.model_dir, ids, kv_bf16=False)
    if a.kv_type == "f32":  # an unrounded engine cache is compared with an unrounded reference
        ref = ref_f32
    res = compare(ref, got)
    res["kv_type"] = a.kv_type
    res["reference_cache"] = ("f32 (unrounded)" if a.kv_type == "f32"
                              else "engine-kv" if use_engine_kv else "own-rounding")
    res["max_abs_diff_own_rounding"] = compare(ref_own, got)["max_abs_diff"]
    res["max_abs_diff_vs_f32_cache_reference"] = compare(ref_f32, got)["max_abs_diff"]
    res["bf16_cache_effect"] = compare(ref_f32, ref)["max_abs_diff"]
    if kv is not None:
        res.update(kv)
    res.update({"model_dir": a.model_dir, "gguf": a.gguf, "n_tokens": int(len(ids)),
                "filler": source, "seed": a.seed, "tol": a.tol})
    weak = []
    try:
        g = gguf_summary(a.gguf)
        weak = sorted({t for n, t in g["tensor_types"].items() if t != "F32"})
        res["gguf_arch"] = g["kv"].get("general.architecture")
        res["gguf_non_f32_types"] = weak
    except (ValueError, struct.error) as e:
        res["gguf_read_error"] = str(e)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    if kv is not None:
        cache = (f"; KV cache: {kv['kv_elements']} elements, {kv['kv_ambiguous']} ambiguous "
                 f"(rel {a.ambiguous_rel:g}; {kv['kv_ambiguous_taken_from_engine_differing']} "
                 f"rounded otherwise by the engine), {kv['kv_mismatches']} mismatches; "
                 f"own-rounding max |diff| {res['max_abs_diff_own_rounding']:.3g}")
    else:
        cache = ("; f32 KV cache on both sides (--kv-type f32, no cache check)"
                 if a.kv_type == "f32" else
                 "; reference's own bf16 cache rounding (--no-engine-kv, no cache check)")
    print(f"parity {a.model_dir} vs {a.gguf}: {len(ids)} tokens ({source}), max |diff| "
          f"{res['max_abs_diff']:.3g} at position {res['worst_position']} token "
          f"{res['worst_token']}, mean {res['mean_abs_diff']:.3g}, argmax agreement "
          f"{res['argmax_agreement']:.4f}, max |logit| {res['max_abs_logit']:.3g} "
          f"(bf16-cache effect in the reference: {res['bf16_cache_effect']:.3g}){cache}")
    failed = False
    if kv is not None and kv["kv_mismatches"] > 0:
        print(f"PARITY FAILED: the engine's KV cache differs from the reference's bf16 rounding "
              f"at {kv['kv_mismatches']} of {kv['kv_elements']} elements ("
              f"{kv['kv_mismatches'] - kv['kv_ambiguous_outside_bounds']} not within "
              f"{a.ambiguous_rel:g} x scale of a rounding midpoint, "
              f"{kv['kv_ambiguous_outside_bounds']} ambiguous but outside the bf16 values "
              f"reachable within that distance); first: "
              + "; ".join(kv["kv_mismatch_examples"]), file=sys.stderr)
        failed = True
    if res["max_abs_diff"] > a.tol:
        hint = ""
        if weak:
            hint = (f"; the GGUF stores weights as {', '.join(weak)} - convert with f32 weights "
                    f"for a {a.tol:g} comparison")
        print(f"PARITY FAILED: max abs logit difference {res['max_abs_diff']:.6g} > tolerance "
              f"{a.tol:g}{hint}", file=sys.stderr)
        failed = True
    if failed:
        return 1
    print(f"PARITY OK (tolerance {a.tol:g}"
          + (", KV cache bit-exact outside the ambiguous elements)" if kv is not None else ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
