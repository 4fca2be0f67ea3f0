#!/usr/bin/env bash
# Decode and prefill tokens/s of Strata and llama.cpp's llama-bench on the same GGUF files, side by
# side with the ratio (issue 17's benchmark). Not part of CI; without llama.cpp it says so, exits 0.
#
# Usage: LLAMA_CPP_BIN=DIR scripts/bench_vs_llamacpp.sh FILE.gguf...
#   LLAMA_CPP_BIN  folder holding llama-bench (a llama.cpp CPU build's bin/)
#   STRATA         the strata binary (default: build/release/strata)
#   THREADS        decode thread counts (default: "1 2"); TOKENS decode tokens (default 64)
#   PREFILL        prompt tokens of the prefill run (default 2048; 0 skips prefill)
# Decode: llama-bench -p 0 -n TOKENS -t T against `strata bench decode --ctx 0 --threads T`.
# Prefill: `strata generate -n 1` on a prompt of about PREFILL tokens (its prompt_tokens /
# prefill_seconds) against llama-bench -p <those tokens> -n 0, at the largest of THREADS.
# Both engines run one after the other on an otherwise idle machine: run it when nothing else is.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
strata="${STRATA:-$root/build/release/strata}"
threads="${THREADS:-1 2}"
tokens="${TOKENS:-64}"
prefill="${PREFILL:-2048}"

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
  if "$LLAMA_CPP_BIN/llama-bench" -m "$f" "$@" -o json >"$tmp/lb.json" 2>"$tmp/lb.err"; then
    python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))[0]["avg_ts"])' \
      "$tmp/lb.json" 2>/dev/null || echo "?"
  else
    echo "fail"
  fi
}
ratio() { python3 -c 'import sys
try: print("%.2fx" % (float(sys.argv[1]) / float(sys.argv[2])))
except Exception: print("-")' "$1" "$2"; }

printf '%-28s %-8s %3s %12s %12s %7s\n' file kind t "strata tok/s" "llama tok/s" ratio
for f in "$@"; do
  name="$(basename "$f")"
  for t in $threads; do
    s="?"
    if "$strata" bench decode -m "$f" --ctx 0 --threads "$t" --tokens "$tokens" \
         --json "$tmp/sb.json" >/dev/null 2>"$tmp/sb.err"; then
      s="$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["results"][0]["tok_per_s"])' "$tmp/sb.json")"
    fi
    l="$(llama_tps "$f" -p 0 -n "$tokens" -t "$t")"
    printf '%-28s %-8s %3s %12s %12s %7s\n' "$name" decode "$t" "$s" "$l" "$(ratio "$s" "$l")"
  done
  if [[ "$prefill" -gt 0 ]]; then
    t="${threads##* }"
    # A prompt of about PREFILL tokens: words are cut to fit the count strata reports, and
    # llama-bench then prefills exactly that many tokens.
    s="?" np="$prefill"
    for words in "$prefill" $((prefill / 2)) $((prefill / 4)); do
      prompt="$(python3 -c 'import sys; print(" ".join(["the"] * int(sys.argv[1])))' "$words")"
      if "$strata" generate -m "$f" -p "$prompt" -n 1 --threads "$t" --json "$tmp/sg.json" \
           >/dev/null 2>"$tmp/sg.err"; then
        read -r np s < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
print(d["prompt_tokens"], "%.1f" % (d["prompt_tokens"] / d["prefill_seconds"]))' "$tmp/sg.json")
        [[ "$np" -le $((prefill + prefill / 8)) ]] && break
      fi
    done
    l="$(llama_tps "$f" -p "$np" -n 0 -t "$t")"
    printf '%-28s %-8s %3s %12s %12s %7s\n' "$name" "pp$np" "$t" "$s" "$l" "$(ratio "$s" "$l")"
  fi
done
