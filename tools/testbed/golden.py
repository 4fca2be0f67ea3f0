#!/usr/bin/python3
"""Turns the quality runs of tools/testbed/quality.sh into models/golden.json (the fixture of
eval/testbed_test.cc) and prints the markdown tables of models/README.md.

  /usr/bin/python3 tools/testbed/golden.py OUT_DIR [--golden models/golden.json] [--merge]

OUT_DIR holds the reports `strata eval needle --json` wrote (nope-mla.json, rope-mla.json,
gqa.json + gqa-geodesia.json + gqa-geodesia-v2.json when the GQA model exists, kimi-linear.json
when the hybrid exists). --merge keeps the existing fixture's cells of every model that has no
report in OUT_DIR (the protocol must match), so one model can be re-measured alone. Every cell goes into the fixture with its
trial count, answered count and Wilson interval; cells marked "fast" run in CI (T = 1024), the
rest only with STRATA_GOLDEN=full. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# Cells CI runs at T = 1024 (the rest run with STRATA_GOLDEN=full): (model, label).
FAST = {
    ("nope-mla", "full@8"), ("nope-mla", "vestige:recall=off@8"),
    ("nope-mla", "vestige:recall=off@32"), ("nope-mla", "vestige@32"),
    ("nope-mla", "streaming@32"), ("nope-mla", "h2o@32"), ("nope-mla", "snapkv@32"),
    ("nope-mla", "random@32"),
    ("rope-mla", "full@8"), ("rope-mla", "vestige:recall=off@8"),
    ("gqa", "full@8"), ("gqa", "geodesia:bits=2:group=32"),
    ("gqa", "geodesia:bits=3.85:group=32:mass=compressed:salience=1"),
    ("gqa", "geodesia:bits=3.8:floor=2:sinks=0"),
    ("gqa", "geodesia:bits=3.4:floor=2:sinks=0:window=0:predecessor=coded"),
    ("kimi-linear", "vestige:recall=off@32"), ("kimi-linear", "streaming@32"),
}


def label(c: dict) -> str:
    name = c["policy"] + (":" + c["variant"] if c.get("variant") else "")
    return name + ("@" + c["ratio"] if c["ratio"] is not None else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--golden", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "golden.json"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the fixture's cells of the models without a report here")
    a = ap.parse_args()
    cells = []
    protocol = None
    reports = [("nope-mla", "nope-mla.json"), ("rope-mla", "rope-mla.json"),
               ("gqa", "gqa.json"), ("gqa", "gqa-geodesia.json"),
               ("gqa", "gqa-geodesia-v2.json"), ("kimi-linear", "kimi-linear.json")]
    measured = {m for m, name in reports if os.path.exists(os.path.join(a.out_dir, name))}
    if a.merge and os.path.exists(a.golden):
        old = json.load(open(a.golden))
        protocol = old["protocol"]
        cells = [c for c in old["cells"] if c["model"] not in measured]
        print(f"kept {len(cells)} cells of {sorted({c['model'] for c in cells})} from {a.golden}",
              file=sys.stderr)
    for model, name in reports:
        path = os.path.join(a.out_dir, name)
        if not os.path.exists(path):
            print(f"note: {path} missing; skipped", file=sys.stderr)
            continue
        rep = json.load(open(path))
        n = rep["needle"]
        p = {"seed": n["seed"], "depth": n["depth_range"], "format": n["format"],
             "haystack": "kjv (bible -l0 gen1:1-rev22:21)", "baseline_gate": n["baseline_gate_nats"],
             "trials": n["trials_per_length"]}
        if protocol is None:
            protocol = p
        elif {k: v for k, v in p.items()} != protocol:
            print(f"error: {path} used a different protocol: {p} vs {protocol}", file=sys.stderr)
            return 2
        settings = {}
        for c in rep.get("configs", []) or []:
            settings[c["label"]] = c["settings"]
        for c in n["cells"]:
            lab = label(c)
            cells.append({
                "model": model, "label": lab, "policy": c["policy"], "variant": c["variant"],
                "ratio": c["ratio"], "length": c["length"], "n": c["n"],
                "answered": c["answered"], "answer_rate": c["answer_rate"],
                "wilson_lo": c["answer_wilson_lo"], "wilson_hi": c["answer_wilson_hi"],
                "token_accuracy": c["token_accuracy"],
                "resident_bits_per_value": c["resident_bits_per_value"],
                "read_bits_per_value": c["read_bits_per_value"],
                "fast": (model, lab) in FAST and c["length"] == 1024,
            })
    if not cells:
        print("error: no reports found", file=sys.stderr)
        return 2
    golden = {"about": "answered (greedy answer exact) per cell, measured by tools/testbed/quality.sh; "
                       "checked by eval/testbed_test.cc", "protocol": protocol,
              "vestige_settings": {"block": "1024", "kappa": "4"}, "cells": cells}
    with open(a.golden, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {a.golden}: {len(cells)} cells", file=sys.stderr)
    # Markdown: one table per model, rows = configs, columns = lengths.
    for model in ["nope-mla", "rope-mla", "gqa", "kimi-linear"]:
        mc = [c for c in cells if c["model"] == model]
        if not mc:
            continue
        lengths = sorted({c["length"] for c in mc})
        print(f"\n**{model}** (answered [Wilson 95%] / token accuracy; resident / read bits per value at "
              f"T = {lengths[-1]})\n")
        print("| config | " + " | ".join(f"T = {L}" for L in lengths) + " | res b/v | read b/v |")
        print("|---|" + "---|" * len(lengths) + "---|---|")
        seen = []
        for c in mc:
            if c["label"] not in seen:
                seen.append(c["label"])
        for lab in seen:
            if lab.startswith("full@") and lab != "full@8":
                continue  # full ignores the ratio: one row
            row = [lab.replace("full@8", "full")]
            last = None
            for L in lengths:
                x = next((c for c in mc if c["label"] == lab and c["length"] == L), None)
                if x is None:
                    row.append("-")
                    continue
                last = x
                row.append(f"{x['answer_rate']:.2f} [{x['wilson_lo']:.2f}, {x['wilson_hi']:.2f}] / "
                           f"{x['token_accuracy']:.2f}")
            row.append(f"{last['resident_bits_per_value']:.2f}" if last else "-")
            row.append(f"{last['read_bits_per_value']:.2f}" if last else "-")
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
