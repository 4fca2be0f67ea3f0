#!/usr/bin/env bash
# Decode and prefill tokens/s of Strata and llama.cpp's llama-bench on the same GGUF files, side by
# side with the ratio, both measured in this run on this machine (the CPU line is printed first).
# Not part of CI; without llama.cpp it says so, exits 0.
#
# Usage: LLAMA_CPP_BIN=DIR scripts/bench_vs_llamacpp.sh FILE.gguf...
#   LLAMA_CPP_BIN  folder holding llama-bench (a llama.cpp CPU build's bin/)
#   STRATA         the strata binary (default: build/release/strata)
#   THREADS        thread counts (default: "1 2"); TOKENS decode tokens (default 64)
#   DEPTHS         decode context depths (default: "0 4096")
#   ROUNDS         rounds per row (default 3), the order of the two engines alternating: this host's
#                  speed drifts between runs (a shared VM), so a row gives the median of each engine
#                  and of the per-round ratios, and the ratios' range
#   LLAMA_REPS     llama-bench repetitions per test within a round (default 1)
#   PREFILL        prompt tokens of the prefill run (default 2048; 0 skips prefill)
# Decode at depth D: llama-bench -p 0 -n TOKENS -d D -t T against `strata bench decode --ctx D
# --threads T`. Prefill: `strata generate -n 1` on a prompt of about PREFILL tokens (its
# prompt_tokens / prefill_seconds) against llama-bench -p <those tokens> -n 0, at each of THREADS.
# Run it when nothing else is.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
strata="${STRATA:-$root/build/release/strata}"
threads="${THREADS:-1 2}"
tokens="${TOKENS:-64}"
prefill="${PREFILL:-2048}"
depths="${DEPTHS:-0 4096}"
reps="${LLAMA_REPS:-1}"
rounds="${ROUNDS:-3}"

if [[ -z "${LLAMA_CPP_BIN:-}" || ! -x "${LLAMA_CPP_BIN:-}/llama-bench" ]]; then
  echo "bench_vs_llamacpp: SKIP: set LLAMA_CPP_BIN to a folder with llama-bench"
  exit 0
fi
if [[ $# -eq 0 ]]; then
  echo "usage: LLAMA_CPP_BIN=DIR $0 FILE.gguf..." >&2
  exit 2
fi
if [[ ! -x "$strata" ]]; then
  echo "bench_vs_llamacpp: $strata is not built" >&2
  exit 2
fi
tmp="$(mktemp -d /tmp/strata-bench-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

# llama-bench's JSON: the mean tok/s of its one test.
llama_tps() {  # FILE ARGS...
  local f="$1"; shift
  if "$LLAMA_CPP_BIN/llama-bench" -m "$f" "$@" -r "$reps" -o json >"$tmp/lb.json" 2>"$tmp/lb.err"; then
    python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))[0]["avg_ts"])' \
      "$tmp/lb.json" 2>/dev/null || echo "?"
  else
    echo "fail"
  fi
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; $(date -u +%Y-%m-%d)"
echo "llama.cpp: $("$LLAMA_CPP_BIN/llama-completion" --version 2>&1 | grep -m1 version)"
echo "each row: $rounds rounds, the engines' order alternating; medians, and the smallest and largest per-round ratio"
printf '%-34s %-10s %3s %12s %12s %7s %13s\n' file kind t "strata tok/s" "llama tok/s" ratio "ratio range"

strata_decode() {  # FILE DEPTH THREADS -> tok/s
  if "$strata" bench decode -m "$1" --ctx "$2" --threads "$3" --tokens "$tokens" \
       --json "$tmp/sb.json" >/dev/null 2>"$tmp/sb.err"; then
    python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["results"][0]["tok_per_s"])' "$tmp/sb.json"
  else
    echo "?"
  fi
}
# A prompt of about PREFILL tokens: words are cut to fit the count strata reports, and llama-bench
# then prefills exactly that many tokens. Sets np (tokens) and s (strata tok/s).
strata_prefill() {  # FILE THREADS
  s="?" np="$prefill"
  local words prompt
  for words in "$prefill" $((prefill / 2)) $((prefill / 4)); do
    prompt="$(python3 -c 'import sys; print(" ".join(["the"] * int(sys.argv[1])))' "$words")"
    if "$strata" generate -m "$1" -p "$prompt" -n 1 --threads "$2" --json "$tmp/sg.json" \
         >/dev/null 2>"$tmp/sg.err"; then
      read -r np s < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(d["prompt_tokens"], "%.1f" % (d["prompt_tokens"] / d["prefill_seconds"]))' "$tmp/sg.json")
      [[ "$np" -le $((prefill + prefill / 8)) ]] && break
    fi
  done
}
# Prints one row from the per-round figures in $tmp/rounds ("strata llama" per line).
row() {  # NAME KIND THREADS
  python3 - "$1" "$2" "$3" "$tmp/rounds" <<'PY'
import statistics, sys
name, kind, t, path = sys.argv[1:5]
pairs = []
for line in open(path):
    a, b = line.split()
    try:
        pairs.append((float(a), float(b)))
    except ValueError:
        pass
if not pairs:
    print(f"{name:34s} {kind:10s} {t:>3s} {'?':>12s} {'?':>12s} {'-':>7s}")
    sys.exit()
r = [a / b for a, b in pairs]
print(f"{name:34s} {kind:10s} {t:>3s} {statistics.median(a for a, _ in pairs):12.1f} "
      f"{statistics.median(b for _, b in pairs):12.1f} {statistics.median(r):6.2f}x "
      f"{min(r):5.2f}-{max(r):.2f}x")
PY
}

for f in "$@"; do
  name="$(basename "$f")"
  for d in $depths; do
    for t in $threads; do
      : >"$tmp/rounds"
      for ((r = 0; r < rounds; ++r)); do
        if ((r % 2 == 0)); then
          s="$(strata_decode "$f" "$d" "$t")"; l="$(llama_tps "$f" -p 0 -n "$tokens" -d "$d" -t "$t")"
        else
          l="$(llama_tps "$f" -p 0 -n "$tokens" -d "$d" -t "$t")"; s="$(strata_decode "$f" "$d" "$t")"
        fi
        echo "$s $l" >>"$tmp/rounds"
      done
      row "$name" "decode@$d" "$t"
    done
  done
  [[ "$prefill" -gt 0 ]] || continue
  for t in $threads; do
    : >"$tmp/rounds"
    for ((r = 0; r < rounds; ++r)); do
      if ((r % 2 == 0)); then
        strata_prefill "$f" "$t"; l="$(llama_tps "$f" -p "$np" -n 0 -t "$t")"
      else
        l="$(llama_tps "$f" -p "$np" -n 0 -t "$t")"; strata_prefill "$f" "$t"
      fi
      echo "$s $l" >>"$tmp/rounds"
    done
    row "$name" "pp$np" "$t"
  done
done
