#!/usr/bin/python3
"""Checks Strata against llama.cpp on the real models scripts/fetch_models.sh places in the model
cache folder (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M). Not part of CI: it needs a
llama.cpp build (LLAMA_CPP_BIN: a folder with llama-completion, llama-perplexity, llama-tokenize).

For each file:
  1. tokenize: `strata tokenize --special --no-bos --ids` and `llama-tokenize --no-bos --ids` on
     every valid-UTF-8 string of testdata/tokenizer/corpus.json (read from a file, verbatim);
  2. greedy: 64 greedy tokens after each of 10 prompts (5 plain, 5 in the model's chat format,
     rendered here as its template renders them) from `strata generate --temp 0 --kv-type f16
     --special` and `llama-completion --temp 0 -no-cnv` (both on an f16 KV cache, llama.cpp's
     default); equal text, or the first differing position and both continuations;
  3. next-token distributions: `llama-perplexity --kl-divergence-base` writes llama.cpp's
     log-probabilities for chunks of --ctx tokens of the KJV (Debian's bible-kjv), the tokens
     included; `strata logits --kv-type f16` runs the very same tokens, and this script computes,
     on llama-perplexity's protocol (the second half of each chunk scored), the mean, p99 and
     max KL divergence of Strata's distribution from llama.cpp's, top-1 agreement, and both
     perplexities.

Usage: LLAMA_CPP_BIN=DIR /usr/bin/python3 scripts/check_real_models.py [--model NAME ...] [--ctx 1024]
       [--chunks 5] [--json OUT] [--threads 2]
Exit 1 when a goal is missed (KL mean > 1e-3, top-1 < 99 %, perplexity off by > 0.5 %, a token id
or a greedy text differs without a near-tie), else 0.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
PLAIN = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "In 1969, the first humans",
]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in one sentence.",
    "List three fruits.",
    "How many legs does a spider have?",
]


def models_dir():
    if os.environ.get("STRATA_MODELS"):
        return os.environ["STRATA_MODELS"]
    cache = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return os.path.join(cache, "strata", "models")


def chat(model, question):
    """The prompt text of one user turn with the generation prompt, as the model's template
    renders it (SmolLM2: its ChatML template with the default system prompt; Gemma 3: its
    template; BOS is added by the tokenizer where the model wants one)."""
    if model == "smollm2":
        return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\n" + question +
                "<|im_end|>\n<|im_start|>assistant\n")
    return "<start_of_turn>user\n" + question + "<end_of_turn>\n<start_of_turn>model\n"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, **kw)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace") if isinstance(r.stderr, bytes) else r.stderr
        raise SystemExit(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{err.strip()[-2000:]}")
    return r


def check_tokenize(a, name, path, tmp):
    corpus = json.load(open(os.path.join(REPO, "testdata/tokenizer/corpus.json")))["strings"]
    same = total = 0
    diffs = []
    for i, s in enumerate(corpus):
        if "base64" in s:
            continue  # llama.cpp reads bytes, strata U+FFFD per sequence: compared elsewhere
        f = os.path.join(tmp, f"tok{i}.txt")
        open(f, "wb").write(s["text"].encode())
        ours = json.loads(run([a.strata, "tokenize", "-m", path, "-f", f, "--special", "--no-bos",
                               "--ids"], text=True).stdout.strip().splitlines()[-1])
        theirs = json.loads(run([os.path.join(a.llama, "llama-tokenize"), "-m", path, "-f", f,
                                 "--no-bos", "--ids", "--log-disable", "--no-escape"],
                                text=True).stdout.strip().splitlines()[-1])
        total += 1
        same += ours == theirs
        if ours != theirs:
            diffs.append({"name": s["name"], "strata": ours[:20], "llama.cpp": theirs[:20]})
    return {"strings": total, "identical": same, "diffs": diffs}


def ids_of(a, path, text, tmp, bos=True):
    f = os.path.join(tmp, "ids_text.txt")
    open(f, "w").write(text)
    cmd = [a.strata, "tokenize", "-m", path, "-f", f, "--special", "--ids"]
    return json.loads(run(cmd + ([] if bos else ["--no-bos"]), text=True).stdout.strip()
                      .splitlines()[-1])


def margin(a, path, prompt, ours, theirs, tmp):
    """At the first token where the continuations differ: Strata's log-probability of its own
    token minus that of llama.cpp's token, from Strata's logits for the common prefix (a near-tie
    when small), and the position. None when the texts do not tokenize to a common prefix."""
    p_ids = ids_of(a, path, prompt, tmp)
    o_ids = ids_of(a, path, prompt + ours, tmp)[len(p_ids):]
    t_ids = ids_of(a, path, prompt + theirs, tmp)[len(p_ids):]
    k = 0
    while k < min(len(o_ids), len(t_ids)) and o_ids[k] == t_ids[k]:
        k += 1
    if k >= min(len(o_ids), len(t_ids)):
        return None
    seq = p_ids + o_ids[:k]
    tf = os.path.join(tmp, "m_tokens.txt")
    open(tf, "w").write("\n".join(str(t) for t in seq) + "\n")
    lf = os.path.join(tmp, "m_logits.f32")
    # Token by token, as generate decodes (its prompt is one prefill chunk, so the prompt rows
    # round a little differently: the gap is Strata's view, not the bit-exact one).
    run([a.strata, "logits", "-m", path, "--tokens", tf, "--out", lf, "--kv-type", "f16",
         "--chunk", "1"])
    z = np.fromfile(lf, dtype="<f4").reshape(len(seq), -1)[-1].astype(np.float64)
    lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    return {"token": k, "strata_minus_llama_logprob": float(lp[o_ids[k]] - lp[t_ids[k]]),
            "strata_top_prob": float(np.exp(lp[o_ids[k]])),
            "llama_choice_prob": float(np.exp(lp[t_ids[k]]))}


def llama_greedy(a, path, f, fa):
    return run([os.path.join(a.llama, "llama-completion"), "-m", path, "-f", f, "-n", "64",
                "--temp", "0", "--top-k", "1", "-no-cnv", "--no-warmup", "-t", str(a.threads),
                "--no-display-prompt", "-fa", fa], text=True, stdin=subprocess.DEVNULL).stdout


def greedy(a, name, path, prompt, tmp):
    f = os.path.join(tmp, "prompt.txt")
    open(f, "w").write(prompt)
    # llama.cpp drops one trailing newline of an -f file (common/arg.cpp): give it one to drop.
    lf = os.path.join(tmp, "prompt_llama.txt")
    open(lf, "w").write(prompt + "\n")
    ours = run([a.strata, "generate", "-m", path, "-f", f, "-n", "64", "--temp", "0", "--kv-type",
                "f16", "--special", "--threads", str(a.threads)], text=True).stdout
    theirs = llama_greedy(a, path, lf, "auto")
    # llama.cpp against itself: its other attention path (flash attention off).
    theirs_fa_off = llama_greedy(a, path, lf, "off")
    # strata prints the prompt, then the continuation, then a newline.
    cont = ours[len(prompt):] if ours.startswith(prompt) else ours
    if cont.endswith("\n"):
        cont = cont[:-1]
    def tidy(t):  # llama-completion ends with "\n\n", after " [end of text]\n" at EOS
        t = t[:-2] if t.endswith("\n\n") else t
        return t[:-len(" [end of text]\n")] if t.endswith(" [end of text]\n") else t
    theirs, theirs_fa_off = tidy(theirs), tidy(theirs_fa_off)
    n = 0
    while n < min(len(cont), len(theirs)) and cont[n] == theirs[n]:
        n += 1
    out = {"prompt": prompt, "equal": cont == theirs, "first_difference": n, "strata": cont,
           "llama.cpp": theirs, "llama.cpp_equal_to_itself_fa_off": theirs == theirs_fa_off}
    if not out["equal"]:
        out["margin"] = margin(a, path, prompt, cont, theirs, tmp)
    return out


def kjv_text(path):
    r = subprocess.run("bible -l0 gen1:1-gen50:26 </dev/null", shell=True, capture_output=True,
                       text=True)
    if r.returncode != 0 or not r.stdout:
        raise SystemExit("`bible` (Debian package bible-kjv) is needed for the KJV text")
    lines = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("Genesis"):
            continue
        lines.append(line.split(" ", 1)[1] if line.split(" ", 1)[0].isdigit() else line)
    open(path, "w").write("\n".join(lines) + "\n")


def read_base(path):
    """llama-perplexity's --kl-divergence-base file: "_logits_", n_ctx u32, n_vocab i32, n_chunk
    i32, the tokens [n_chunk * n_ctx] i32, then per chunk (n_ctx - 1 - n_ctx/2) rows of nv =
    2 * ((n_vocab + 1) / 2) + 4 uint16: (scale f32, min_log_prob f32) and n_vocab quantized
    log-probabilities (log p = min_log_prob + scale * q)."""
    raw = open(path, "rb").read()
    assert raw[:8] == b"_logits_", path
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw[8:20], dtype="<u4").astype(int)
    off = 20
    tokens = np.frombuffer(raw[off:off + 4 * n_ctx * n_chunk], dtype="<i4").reshape(n_chunk, n_ctx)
    off += 4 * n_ctx * n_chunk
    nv = 2 * ((n_vocab + 1) // 2) + 4
    rows = n_ctx - 1 - n_ctx // 2
    lp = np.frombuffer(raw[off:off + 2 * nv * rows * n_chunk], dtype="<u2").reshape(n_chunk, rows, nv)
    return n_ctx, n_vocab, tokens, lp


def base_log_probs(row, n_vocab):
    head = row[:4].copy().view("<f4")
    scale, min_lp = float(head[0]), float(head[1])
    return min_lp + scale * row[4:4 + n_vocab].astype(np.float64)


def check_kld(a, name, path, tmp):
    text = os.path.join(tmp, "kjv.txt")
    kjv_text(text)
    base = os.path.join(tmp, f"{name}.kld")
    out = run([os.path.join(a.llama, "llama-perplexity"), "-m", path, "-f", text, "-c",
               str(a.ctx), "-b", str(a.ctx), "--chunks", str(a.chunks), "-t", str(a.threads),
               "--kl-divergence-base", base], text=True)
    ppl_llama = None
    for line in (out.stdout + out.stderr).splitlines():
        if "Final estimate: PPL" in line:
            ppl_llama = float(line.split("=")[1].split()[0])
    n_ctx, n_vocab, tokens, lp = read_base(base)
    # llama-perplexity evaluates each chunk with its first token replaced by BOS where the
    # vocabulary adds one (the file keeps the text's token); so does this script.
    bos = json.loads(run([a.strata, "tokenize", "-m", path, "-p", "", "--ids"],
                         text=True).stdout.strip().splitlines()[-1])
    tokens = tokens.copy()
    if bos:
        tokens[:, 0] = bos[0]
    kls, top1, nll_ours, nll_theirs = [], 0, 0.0, 0.0
    first = n_ctx // 2
    for c in range(tokens.shape[0]):
        tf = os.path.join(tmp, "tokens.txt")
        open(tf, "w").write("\n".join(str(int(t)) for t in tokens[c]) + "\n")
        lf = os.path.join(tmp, "logits.f32")
        run([a.strata, "logits", "-m", path, "--tokens", tf, "--out", lf, "--kv-type", "f16",
             "--chunk", str(a.strata_chunk)])
        z = np.fromfile(lf, dtype="<f4").reshape(n_ctx, -1)[:, :n_vocab].astype(np.float64)
        os.remove(lf)
        for i in range(first, n_ctx - 1):
            row = z[i]
            ours = row - row.max()
            ours = ours - np.log(np.exp(ours).sum())
            theirs = base_log_probs(lp[c, i - first], n_vocab)
            # As llama-perplexity --kl-divergence sums it: the base row's log-probabilities as
            # stored (16-bit codes over [max - 16, max]), terms with log p_base > -16 only.
            keep = theirs > -16.0
            kls.append(float((np.exp(theirs[keep]) * (theirs[keep] - ours[keep])).sum()))
            top1 += int(ours.argmax() == theirs.argmax())
            nxt = int(tokens[c, i + 1])
            nll_ours -= ours[nxt]
            nll_theirs -= theirs[nxt]
    k = np.array(kls)
    n = len(kls)
    res = {"tokens_scored": n, "ctx": int(n_ctx), "kld_mean": float(k.mean()),
           "kld_p99": float(np.percentile(k, 99)), "kld_max": float(k.max()),
           "top1_agreement": top1 / n, "ppl_strata": float(np.exp(nll_ours / n)),
           "ppl_llama_base_rows": float(np.exp(nll_theirs / n)), "ppl_llama_reported": ppl_llama}
    res["ppl_rel_diff"] = abs(res["ppl_strata"] / res["ppl_llama_base_rows"] - 1)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=os.path.join(REPO, "build", "release", "strata"))
    ap.add_argument("--llama", default=os.environ.get("LLAMA_CPP_BIN", ""))
    ap.add_argument("--model", action="append", choices=sorted(MODELS))
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strata-chunk", type=int, default=512,
                    help="strata's prefill chunk (1: every token through the decode path)")
    ap.add_argument("--skip", action="append", default=[], choices=["tokenize", "greedy", "kld"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not a.llama or not os.path.exists(os.path.join(a.llama, "llama-completion")):
        print("check_real_models: SKIP: LLAMA_CPP_BIN is not a folder with llama-completion")
        return 0
    report, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.model or sorted(MODELS):
            path = os.path.join(models_dir(), MODELS[name])
            if not os.path.exists(path):
                raise SystemExit(f"{path} is missing: run scripts/fetch_models.sh")
            r = report[name] = {"file": MODELS[name]}
            if "tokenize" not in a.skip:
                r["tokenize"] = check_tokenize(a, name, path, tmp)
                t = r["tokenize"]
                print(f"{name}: tokenize {t['identical']}/{t['strings']} identical", flush=True)
                ok &= t["identical"] == t["strings"]
            if "greedy" not in a.skip:
                r["greedy"] = [greedy(a, name, path, p, tmp) for p in PLAIN] + \
                              [greedy(a, name, path, chat(name, q), tmp) for q in QUESTIONS]
                eq = sum(g["equal"] for g in r["greedy"])
                self_eq = sum(g["llama.cpp_equal_to_itself_fa_off"] for g in r["greedy"])
                print(f"{name}: greedy 64 tokens {eq}/{len(r['greedy'])} prompts equal to "
                      f"llama.cpp (llama.cpp -fa auto vs -fa off: {self_eq}/{len(r['greedy'])})",
                      flush=True)
                for g in r["greedy"]:
                    if not g["equal"]:
                        m = g.get("margin") or {}
                        print(f"  differs at token {m.get('token')} of {g['prompt'][:40]!r}: "
                              f"strata p {m.get('strata_top_prob', 0):.3f} vs llama.cpp's choice "
                              f"p {m.get('llama_choice_prob', 0):.3f} (log-prob gap "
                              f"{m.get('strata_minus_llama_logprob', 0):.3f}); llama.cpp equal to "
                              f"itself with -fa off: {g['llama.cpp_equal_to_itself_fa_off']}")
            if "kld" not in a.skip:
                r["kld"] = k = check_kld(a, name, path, tmp)
                print(f"{name}: KL mean {k['kld_mean']:.3g} p99 {k['kld_p99']:.3g} max "
                      f"{k['kld_max']:.3g}, top-1 {100 * k['top1_agreement']:.2f} %, PPL strata "
                      f"{k['ppl_strata']:.4f} vs llama.cpp {k['ppl_llama_base_rows']:.4f} "
                      f"(reported {k['ppl_llama_reported']}), {k['tokens_scored']} tokens",
                      flush=True)
                ok &= k["kld_mean"] <= 1e-3 and k["top1_agreement"] >= 0.99 and \
                    k["ppl_rel_diff"] <= 0.005
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
