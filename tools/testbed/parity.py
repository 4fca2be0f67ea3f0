#!/usr/bin/python3
"""Logit parity between the PyTorch testbed model and Strata on a fixed 512-token sequence.

  /usr/bin/python3 tools/testbed/parity.py --model-dir RUN/hf --gguf /tmp/m.gguf \
      [--strata build/release/cli/strata] [--tol 1e-3]

Strata's side is `strata logits -m FILE.gguf --tokens TOKENS.txt --out LOGITS.f32`, which must
write raw little-endian f32 [n_tokens, vocab] (logits at every position of the given ids, no BOS
added: the sequence already starts with BOS = 0). TOKENS.txt holds whitespace-separated decimal
ids (written one per line here). The reference applies the engine's bf16 KV-cache rounding
(tb_model kv_bf16=True); everything else is f32, so the GGUF must hold F32 weights
(`strata convert DIR -o FILE.gguf --dtype f32`); with F16 weights expect ~1e-2 differences.

Exit status: 0 when max |logit difference| <= tol, 1 when it is larger, 2 on usage or tool errors.
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


def find_strata(explicit: str | None) -> str | None:
    cands = [explicit, os.environ.get("STRATA_BIN"),
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
                      vocab: int) -> np.ndarray:
    tok_path = os.path.join(workdir, "tokens.txt")
    out_path = os.path.join(workdir, "logits.f32")
    with open(tok_path, "w") as f:
        f.write("\n".join(str(int(i)) for i in ids) + "\n")
    cmd = [strata, "logits", "-m", gguf, "--tokens", tok_path, "--out", out_path]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit status {r.returncode}:\n"
                           f"{r.stderr.strip() or r.stdout.strip()}")
    raw = np.fromfile(out_path, dtype="<f4")
    if raw.size != len(ids) * vocab:
        raise RuntimeError(f"{out_path}: {raw.size} floats, expected {len(ids)} x {vocab} = "
                           f"{len(ids) * vocab}")
    return raw.reshape(len(ids), vocab).astype(np.float32)


def reference_logits(model_dir: str, ids: np.ndarray, kv_bf16: bool) -> np.ndarray:
    import torch
    import tb_hf
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = tb_hf.load(model_dir)
    with torch.no_grad():
        lo = model(torch.from_numpy(ids[None].astype(np.int64)), kv_bf16=kv_bf16)[0]
    return lo.numpy().astype(np.float32)


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
    p.add_argument("--strata", help="strata binary (default: $STRATA_BIN, build/release/cli/"
                   "strata, PATH)")
    p.add_argument("--tol", type=float, default=1e-3, help="max abs logit difference (1e-3)")
    p.add_argument("--len", type=int, default=DEFAULT_LEN)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--keep", help="keep tokens.txt and logits.f32 in this directory")
    a = p.parse_args(argv)

    try:
        import torch  # noqa: F401
    except ImportError:
        print("parity: torch is not importable (use /usr/bin/python3 with python3-torch)",
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

    ids, source = fixed_tokens(a.len, a.seed)
    workdir = a.keep or tempfile.mkdtemp(prefix="strata-parity-")
    os.makedirs(workdir, exist_ok=True)
    try:
        got = run_strata_logits(strata, a.gguf, ids, workdir, vocab)
    except (RuntimeError, OSError) as e:
        print(f"parity: {e}", file=sys.stderr)
        return 2
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ref = reference_logits(a.model_dir, ids, kv_bf16=True)
    ref_f32 = reference_logits(a.model_dir, ids, kv_bf16=False)
    res = compare(ref, got)
    res["max_abs_diff_vs_f32_cache_reference"] = compare(ref_f32, got)["max_abs_diff"]
    res["bf16_cache_effect"] = compare(ref_f32, ref)["max_abs_diff"]
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
    print(f"parity {a.model_dir} vs {a.gguf}: {len(ids)} tokens ({source}), max |diff| "
          f"{res['max_abs_diff']:.3g} at position {res['worst_position']} token "
          f"{res['worst_token']}, mean {res['mean_abs_diff']:.3g}, argmax agreement "
          f"{res['argmax_agreement']:.4f}, max |logit| {res['max_abs_logit']:.3g} "
          f"(bf16-cache effect in the reference: {res['bf16_cache_effect']:.3g})")
    if res["max_abs_diff"] > a.tol:
        hint = ""
        if weak:
            hint = (f"; the GGUF stores weights as {', '.join(weak)} - convert with f32 weights "
                    f"for a {a.tol:g} comparison")
        print(f"PARITY FAILED: max abs logit difference {res['max_abs_diff']:.6g} > tolerance "
              f"{a.tol:g}{hint}", file=sys.stderr)
        return 1
    print(f"PARITY OK (tolerance {a.tol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
