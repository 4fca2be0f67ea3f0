"""Shared parts of the whole-model parity scripts (tools/kimi/parity.py, tools/gemma3/parity.py):
a float64 safetensors reader, the synth -> convert -> `strata logits` pipeline, and the comparison
against a PyTorch float64 reference. Each script supplies its architecture and its reference
forward. Exit 0 with "skipped: ..." when numpy or torch is not importable.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # the ctest wrapper treats this as a skip
    print(f"skipped: {e}")
    sys.exit(0)

torch.set_default_dtype(torch.float64)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = {"F32": np.float32, "F16": np.float16}.get(info["dtype"])
        if dt is None:
            raise SystemExit(f"{path}: tensor {name} has dtype {info['dtype']} (use --dtype f32)")
        arr = np.frombuffer(data[b:e], dtype=dt).astype(np.float64).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stderr.strip()}")
    return r


def main(arch, reference_logits, description, default_len, argv=None):
    """synth --arch ARCH (tiny, f32 safetensors) -> convert -> strata logits, against
    reference_logits(model_dir, ids); prints and returns the verdict (0: within --tol)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--strata", default=os.path.join(REPO, "build", "release", "strata"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--len", type=int, default=default_len)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--dims", default="", help="extra `strata synth --dims`")
    ap.add_argument("--model-dir", help="an existing HF directory of the architecture (f32 "
                    "safetensors) instead of a synth one")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = a.model_dir or os.path.join(tmp, "hf")
        if not a.model_dir:
            cmd = [a.strata, "synth", "--arch", arch, "--preset", "tiny", "--format",
                   "safetensors", "--dtype", "f32", "--seed", str(a.seed), "-o", d]
            if a.dims:
                cmd += ["--dims", a.dims]
            run(cmd)
        gguf = os.path.join(tmp, "model.gguf")
        run([a.strata, "convert", d, "-o", gguf, "--dtype", "f32"])
        with open(os.path.join(d, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        rng = np.random.default_rng(a.seed)
        ids = rng.integers(0, vocab, size=a.len)
        tok = os.path.join(tmp, "tokens.txt")
        with open(tok, "w") as f:
            f.write("\n".join(str(int(i)) for i in ids) + "\n")
        out = os.path.join(tmp, "logits.f32")
        run([a.strata, "logits", "-m", gguf, "--tokens", tok, "--out", out, "--kv-type", "f32"])
        got = np.fromfile(out, dtype="<f4").reshape(a.len, vocab).astype(np.float64)
        ref = reference_logits(d, ids)
    diff = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    res = {"n_tokens": a.len, "vocab": vocab, "max_abs_diff": diff, "logit_scale": scale,
           "argmax_agreement": agree, "tol": a.tol, "ok": diff <= a.tol}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if diff <= a.tol else 1
