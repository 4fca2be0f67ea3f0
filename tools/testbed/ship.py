#!/usr/bin/python3
"""Ships a finished training run into models/: the HF export (models/hf/NAME), its training record
(models/hf/NAME/training.json: the run's summary plus the loss curve sampled every 50 steps and the
quick evaluations), and the GGUF (`strata convert --dtype f32`, models/NAME.gguf).

  /usr/bin/python3 tools/testbed/ship.py RUN_DIR NAME --strata build/release/strata
  /usr/bin/python3 tools/testbed/ship.py tools/testbed/runs/kimi kimi-linear   # the hybrid
  /usr/bin/python3 tools/testbed/ship.py tools/testbed/runs/nope576 nope-mla-576 --dtype bf16

--no-gguf ships the HF export and the record only (for an architecture whose `strata convert`
is not there yet); run ship.py again without it later to write the GGUF.

--dtype bf16 ships the weights rounded to bf16 (nearest even) in both the safetensors and the GGUF
(half the bytes of F32): PyTorch and the engine then read the same numbers, so the logit parity
holds as it does for F32. It needs numpy (the rounding); F32 needs the standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("name")
    ap.add_argument("--strata", default=os.path.join(REPO, "build", "release", "strata"))
    ap.add_argument("--every", type=int, default=50, help="loss-curve sampling in steps")
    ap.add_argument("--no-gguf", action="store_true", help="skip `strata convert`")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="weights as shipped (default f32)")
    a = ap.parse_args()
    summary_path = os.path.join(a.run_dir, "summary.json")
    hf = os.path.join(a.run_dir, "hf")
    if not os.path.exists(summary_path) or not os.path.isdir(hf):
        print(f"error: {a.run_dir} has no finished run (summary.json and hf/)", file=sys.stderr)
        return 2
    summary = json.load(open(summary_path))
    curve, evals, sessions = [], [], []
    with open(os.path.join(a.run_dir, "log.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            t = rec.get("t")
            if t == "step" and (rec["step"] % a.every == 0 or rec["step"] == summary["steps"]):
                curve.append({k: rec[k] for k in ("step", "tokens", "train_s", "L", "lr", "lm_ema",
                                                  "ans_ema") if k in rec})
            elif t == "eval":
                evals.append(rec)
            elif t in ("start", "resume"):
                sessions.append(rec)
    # A resumed run re-logs the steps after its last checkpoint: keep the last record of a step.
    dedup = {}
    for c in curve:
        dedup[c["step"]] = c
    out_dir = os.path.join(REPO, "models", "hf", a.name)
    os.makedirs(out_dir, exist_ok=True)
    for fn in ("config.json", "model.safetensors", "strata_tokenizer.json"):
        shutil.copyfile(os.path.join(hf, fn), os.path.join(out_dir, fn))
    if a.dtype == "bf16":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import tb_hf  # numpy (and torch, which tb_hf imports)
        st = os.path.join(out_dir, "model.safetensors")
        meta = {}
        tensors = tb_hf.read_safetensors(st, meta)
        tb_hf.write_safetensors(st, tensors, meta, "BF16")
    record = {"summary": summary, "sessions": sessions, "quick_evals": evals,
              "loss_curve": [dedup[k] for k in sorted(dedup)]}
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(record, f, indent=0)
        f.write("\n")
    if a.no_gguf:
        print(f"shipped {a.name}: {out_dir} (no GGUF: --no-gguf)")
        return 0
    gguf = os.path.join(REPO, "models", a.name + ".gguf")
    r = subprocess.run([a.strata, "convert", out_dir, "-o", gguf, "--dtype", a.dtype,
                        "--overwrite"])
    if r.returncode != 0:
        return r.returncode
    print(f"shipped {a.name}: {out_dir}, {gguf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
