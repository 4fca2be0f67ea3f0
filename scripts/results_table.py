#!/usr/bin/env python3
"""The KV-cache results table of a real model: RULER (compression before the question), KL
divergence to the full cache, perplexity, resident and read bits per value and decode speed, for
every baseline at matched budgets, measured by `strata eval ruler` and `strata eval kld` in one
run on this machine.

  python3 scripts/results_table.py smollm2 --out out/table-smollm2      # docs/results.md's table
  python3 scripts/results_table.py gemma3 --out out/table-gemma3
  python3 scripts/results_table.py smollm2 --out DIR --render-only      # re-render saved JSON
  python3 scripts/results_table.py smollm2 --out DIR --thin             # the CI slice (~1 min)

Each length runs `eval ruler` (every task, --samples per task, every policy) and one `eval kld`
(--kld-windows windows of the task length, the causal Q=1 protocol). The table goes to
OUT/table.md (and stdout) with the command, the CPU and the date. Standard library only.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.expanduser(os.environ.get("STRATA_MODELS", "~/.cache/strata/models"))

# The models and their lengths: SmolLM2 at 4,096 and 8,192; Gemma 3 at 4,096 and 16,384 (its
# sliding-window layers keep their window; the policies compress the global layers).
PRESETS = {
    "smollm2": {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "lengths": [4096, 8192],
                "samples": 4, "kld_windows": 2},
    "gemma3": {"file": "gemma-3-270m-q4_k_m.gguf", "lengths": [4096, 16384],
               "samples": 3, "kld_windows": 1},
}

# Every policy at a budget near 4 bits per value (eviction: 1/4 of the rows read), with the
# quantizers at their own rates; Geodesia at about 3, 4 and 5 bits in both profiles.
POLICIES = [
    "full",
    "geodesia:bits=3", "geodesia:bits=4", "geodesia:bits=5",
    "geodesia:profile=reference:bits=3", "geodesia:profile=reference:bits=4",
    "geodesia:profile=reference:bits=5",
    "cquest",
    "kivi2", "kivi4",
    "turboquant:preset=k8v4", "turboquant:preset=4bit", "turboquant:preset=k3v4",
    "turboquant:preset=3bit",
    "q8_0", "q8_0:rotate=off", "q4_0", "q4_0:rotate=off",
    "coldfp4",
    "snapkv", "h2o", "streaming", "quest",
]
RATIO = "4"  # the eviction policies' budget (the quantizers ignore it)
# Questions per compressed context (eval ruler --questions): the multi-key tasks answer their
# other keys from forks of one compression, four times the samples for one prefill.
QUESTIONS = 4
THIN = {"lengths": [1024], "samples": 1, "kld_windows": 1, "tasks": "niah_single_1,vt",
        "policies": ["full", "geodesia:bits=3", "kivi2", "turboquant:preset=3bit", "snapkv"]}


def cpu_name() -> str:
    """'AMD EPYC (family 0x1a, model 0x02)': the name alone hides the generation on VMs."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info.setdefault(k.strip(), v.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    name = info.get("model name", platform.processor() or "unknown CPU")
    try:
        return f"{name} (family {int(info['cpu family']):#04x}, model {int(info['model']):#04x})"
    except (KeyError, ValueError):
        return name


def check_thin(table: str, policies: list) -> list:
    """The CI slice's checks: a row per policy, full's row exact (KLD 0, 16 bits), numbers in
    every measured column."""
    problems = []
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 8 and cells[0] not in ("policy",):
            rows[cells[0]] = cells
    for p in policies:
        label = p + "@" + RATIO if p in ("snapkv", "h2o", "streaming", "quest") else p
        if label not in rows:
            problems.append(f"no row for {label}")
            continue
        for c in rows[label][-7:]:
            if c == "-":
                problems.append(f"{label}: a measured column is empty: {rows[label]}")
                break
    full = rows.get("full")
    if full and (full[-7] != "0.0000" or full[-3] != "16.00" or full[-2] != "16.00"):
        problems.append(f"full's row is not the exact reference: {full}")
    return problems


def run(cmd: list, log) -> None:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    log.write("+ " + " ".join(cmd) + "\n")
    log.flush()
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.write(f"# exit {r.returncode} after {time.monotonic() - t0:.0f} s\n")
    if r.returncode != 0:
        raise SystemExit(f"error: {cmd[1]} {cmd[2]} failed (exit {r.returncode}); see {log.name}")


def fmt(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render(out: str, meta: dict) -> str:
    lines = [f"Model `{meta['model']}`; {meta['samples']} samples per RULER task and length "
             f"(up to {QUESTIONS} questions per context on the multi-key tasks), "
             f"{meta['kld_windows']} KLD window(s) of the task length; eviction policies at "
             f"ratio {RATIO}. Measured {meta['date']} on {meta['cpu']}, {meta['threads']} "
             f"threads; command: `{meta['command']}`.", ""]
    goal_lines = []
    for length in meta["lengths"]:
        ruler = json.load(open(os.path.join(out, f"ruler-{length}.json")))["ruler"]
        kl = json.load(open(os.path.join(out, f"kld-{length}.json")))["kl"]
        tasks = ruler["tasks"]
        strong = next((f["tasks"] for f in ruler["full_tasks"] if f["length"] == length), [])
        kl_by = {c["label"]: c for c in kl["configs"]}
        avg_by = {a["label"]: a for a in ruler["averages"] if a["length"] == length}
        cell = {(c["label"], c["task"]): c["score"] for c in ruler["cells"]
                if c["length"] == length}
        lines.append(f"### T = {length}")
        lines.append("")
        lines.append(f"RULER average over the tasks where `full` scores >= 0.3: "
                     f"{', '.join(strong) if strong else 'none'}.")
        lines.append("")
        head = (["policy", "RULER avg (full>=0.3)", "RULER avg (all)"] + tasks +
                ["KLD mean", "KLD p99", "same top-1", "PPL", "res b/v", "read b/v",
                 "decode tok/s"])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        rows = {}
        for cfg in ruler["configs"]:
            label = cfg["label"]
            a = avg_by.get(label, {})
            k = kl_by.get(label, {})
            strong_avg = (sum(cell.get((label, t), 0) for t in strong) / len(strong)
                          if strong else None)
            ach = a.get("achieved", {})
            res = 16 * ach["resident_vs_full"] if "resident_vs_full" in ach else None
            read = 16 * ach["read_vs_full"] if "read_vs_full" in ach else None
            rows[label] = {"strong": strong_avg, "kld": k.get("mean_kl"), "res": res}
            lines.append("| " + " | ".join(
                [label, fmt(strong_avg), fmt(a.get("average"))] +
                [fmt(cell.get((label, t)), 2) for t in tasks] +
                [fmt(k.get("mean_kl"), 4), fmt(k.get("p99_kl"), 3),
                 fmt(100 * k["same_top1_fraction"], 1) + " %" if k else "-",
                 fmt(k.get("ppl"), 3), fmt(res, 2), fmt(read, 2),
                 fmt(a.get("decode_tokens_per_s"), 1)]) + " |")
        lines.append("")
        # The goal: Geodesia's best profile at resident bits <= turboquant 3-bit's against it.
        tq = rows.get("turboquant:preset=3bit")
        geo = [(lab, r) for lab, r in rows.items() if lab.startswith("geodesia")]
        if tq and tq["res"] is not None and geo and strong:
            fit = [(lab, r) for lab, r in geo if r["res"] is not None and r["res"] <= tq["res"]]
            if fit:
                lab, best = max(fit, key=lambda x: (x[1]["strong"], -(x[1]["kld"] or 1e9)))
                met = best["strong"] >= tq["strong"] and (best["kld"] or 1e9) <= (tq["kld"] or 0)
                goal_lines.append(
                    f"- T = {length}: `{lab}` ({fmt(best['res'], 2)} resident b/v) RULER "
                    f"{fmt(best['strong'])}, KLD {fmt(best['kld'], 4)} against "
                    f"`turboquant:preset=3bit` ({fmt(tq['res'], 2)} b/v) RULER "
                    f"{fmt(tq['strong'])}, KLD {fmt(tq['kld'], 4)}: "
                    f"{'met' if met else 'NOT met'}.")
            else:
                goal_lines.append(f"- T = {length}: no Geodesia profile at or under "
                                  f"turboquant 3-bit's {fmt(tq['res'], 2)} resident b/v.")
    if goal_lines:
        lines += ["Goal (Geodesia's best profile at matched resident bits >= turboquant 3-bit on "
                  "the RULER average, <= its mean KLD):", ""] + goal_lines + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(PRESETS), help="the real model")
    ap.add_argument("--out", required=True, help="folder for the JSON reports, logs and table.md")
    ap.add_argument("--strata", default=os.path.join(REPO, "build", "release", "strata"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", help="comma-separated (default: the model's)")
    ap.add_argument("--samples", type=int, help="RULER samples per task and length")
    ap.add_argument("--kld-windows", type=int)
    ap.add_argument("--thin", action="store_true",
                    help="the CI slice: 1,024 tokens, 2 tasks, 1 sample, 5 policies")
    ap.add_argument("--render-only", action="store_true", help="re-render OUT's saved reports")
    a = ap.parse_args(argv)
    p = dict(PRESETS[a.model])
    tasks, policies = "all", POLICIES
    if a.thin:
        p.update({k: THIN[k] for k in ("lengths", "samples", "kld_windows")})
        tasks, policies = THIN["tasks"], THIN["policies"]
    if a.lengths:
        p["lengths"] = [int(x) for x in a.lengths.split(",")]
    if a.samples:
        p["samples"] = a.samples
    if a.kld_windows:
        p["kld_windows"] = a.kld_windows
    model = os.path.join(MODELS, p["file"])
    os.makedirs(a.out, exist_ok=True)
    meta_path = os.path.join(a.out, "meta.json")
    if not a.render_only:
        if not os.path.exists(model):
            print(f"error: {model} is missing (scripts/setup.sh fetches it)", file=sys.stderr)
            return 2
        meta = {"model": p["file"], "lengths": p["lengths"], "samples": p["samples"],
                "kld_windows": p["kld_windows"], "threads": a.threads, "cpu": cpu_name(),
                "date": datetime.date.today().isoformat(),
                "command": "python3 scripts/results_table.py " + " ".join(
                    sys.argv[1:] if argv is None else argv)}
        t0 = time.monotonic()
        with open(os.path.join(a.out, "log.txt"), "w") as log:
            for length in p["lengths"]:
                common = ["-m", model, "--policy", ",".join(policies), "--ratio", RATIO,
                          "-t", str(a.threads)]
                run([a.strata, "eval", "ruler"] + common +
                    ["--len", str(length), "--samples", str(p["samples"]), "--task", tasks,
                     "--questions", str(QUESTIONS),
                     "--json", os.path.join(a.out, f"ruler-{length}.json")], log)
                run([a.strata, "eval", "kld"] + common +
                    ["--len", str(length), "--windows", str(p["kld_windows"]),
                     "--json", os.path.join(a.out, f"kld-{length}.json")], log)
        meta["elapsed_s"] = round(time.monotonic() - t0)
        with open(meta_path, "w") as f:
            json.dump(meta, f, indent=1)
    meta = json.load(open(meta_path))
    table = render(a.out, meta) + f"\nElapsed: {meta.get('elapsed_s', '?')} s.\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    if a.thin:
        problems = check_thin(table, policies)
        for p in problems:
            print("error: " + p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
