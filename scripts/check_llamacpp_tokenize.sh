#!/usr/bin/env bash
# Checks that the GGUF `strata convert` writes from a real tokenizer.json loads in llama.cpp and
# tokenizes the corpus as the reference does (issue 14: convert copies the tokenizer "exactly as
# llama.cpp's converter does, so the result loads in llama.cpp and tokenizes the same").
#
# For each tokenizer (Llama 3, Qwen3, DeepSeek V3 from the shared fixtures, $STRATA_FIXTURES or
# ../shared/fixtures, and the
# Kimi-K2-style fixture), a random-weight llama checkpoint with the tokenizer's vocab_size is
# synthesized, the tokenizer files are copied in, `strata convert` writes the GGUF, and
# llama-tokenize (vocab only, --no-bos, special tokens parsed) tokenizes every corpus string of
# testdata/tokenizer/corpus.json, read verbatim from a file. Its ids are compared with
# testdata/tokenizer/ref_<name>.json (the HF reference, which io/tokenizer_ref_test.cc shows
# Strata's ids equal for every valid-UTF-8 string). Not part of CI: without llama.cpp it prints
# why and exits 0.
#
# Usage: LLAMA_CPP_BIN=DIR scripts/check_llamacpp_tokenize.sh [NAME ...]
#   LLAMA_CPP_BIN  folder holding llama-tokenize, e.g. a llama.cpp build's bin/
#   STRATA         the strata binary (default: build/release/strata)
#   NAME           llama3 qwen3 deepseek_v3 kimi_style (default: all four)
# Prints one line per differing string and a summary per tokenizer. Exit status: 1 if a file
# does not load or any string differs, else 0.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
strata="${STRATA:-$root/build/release/strata}"
if [[ -z "${LLAMA_CPP_BIN:-}" ]]; then
  echo "check_llamacpp_tokenize: SKIP: LLAMA_CPP_BIN is not set (a folder with llama-tokenize)"
  exit 0
fi
tokenize="$LLAMA_CPP_BIN/llama-tokenize"
if [[ ! -x "$tokenize" ]]; then
  echo "check_llamacpp_tokenize: SKIP: no llama-tokenize in LLAMA_CPP_BIN=$LLAMA_CPP_BIN"
  exit 0
fi
if [[ ! -x "$strata" ]]; then
  echo "check_llamacpp_tokenize: FAIL: no strata binary at $strata (build it or set STRATA)"
  exit 1
fi
names=("$@")
((${#names[@]})) || names=(llama3 qwen3 deepseek_v3 kimi_style)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
for name in "${names[@]}"; do
  ref="$root/testdata/tokenizer/ref_$name.json"
  if [[ ! -f "$ref" ]]; then
    echo "$name: FAIL: no $ref"; status=1; continue
  fi
  dir="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokenizer_dir"])' "$ref")"
  fixtures="${STRATA_FIXTURES:-$root/../shared/fixtures}"
  case "$dir" in
    '$STRATA_FIXTURES/'*) dir="$fixtures/${dir#\$STRATA_FIXTURES/}" ;;
    *) dir="$root/$dir" ;;
  esac
  if [[ ! -f "$dir/tokenizer.json" ]]; then
    echo "$name: SKIP: $dir/tokenizer.json is absent (run scripts/setup.sh)"; continue
  fi
  # The vocab_size the model needs: every id of the tokenizer, rounded up as the real models are.
  vocab="$(python3 - "$dir/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ids = list(j["model"]["vocab"].values()) + [a["id"] for a in j.get("added_tokens", [])]
print({151669: 151936, 128818: 129280}.get(max(ids) + 1, max(ids) + 1))
PY
)"
  hf="$tmp/hf_$name"
  gguf="$tmp/$name.gguf"
  if ! "$strata" synth --arch llama --dims "vocab=$vocab,tied=1" --format safetensors \
      --dtype f16 -o "$hf" >/dev/null 2>"$tmp/err"; then
    echo "$name: FAIL: strata synth: $(tail -1 "$tmp/err")"; status=1; continue
  fi
  cp "$dir/tokenizer.json" "$dir/tokenizer_config.json" "$hf/"
  if ! "$strata" convert "$hf" -o "$gguf" --dtype f16 >"$tmp/out" 2>"$tmp/err"; then
    echo "$name: FAIL: strata convert: $(tail -1 "$tmp/err")"; status=1; continue
  fi
  echo "$name: $(grep -o 'tokenizer: .*' "$tmp/out")"
  # One file per corpus string, bytes as Strata is given them (base64 entries decoded).
  python3 - "$root/testdata/tokenizer/corpus.json" "$tmp/in_$name" <<'PY'
import base64, json, os, sys
os.makedirs(sys.argv[2], exist_ok=True)
for i, s in enumerate(json.load(open(sys.argv[1]))["strings"]):
    data = base64.b64decode(s["base64"]) if "base64" in s else s["text"].encode("utf-8")
    open(os.path.join(sys.argv[2], "%03d" % i), "wb").write(data)
PY
  : >"$tmp/ids_$name"
  load_ok=1
  for f in "$tmp/in_$name"/*; do
    if ! out="$("$tokenize" -m "$gguf" -f "$f" --no-escape --no-bos --ids --log-disable 2>"$tmp/err")"; then
      echo "$name: FAIL: llama-tokenize does not load $gguf: $(tail -2 "$tmp/err" | tr '\n' ' ')"
      load_ok=0; status=1; break
    fi
    echo "$out" | tail -1 >>"$tmp/ids_$name"
  done
  ((load_ok)) || continue
  if ! python3 - "$ref" "$root/testdata/tokenizer/corpus.json" "$tmp/ids_$name" "$name" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["cases"]
corpus = json.load(open(sys.argv[2]))["strings"]
got = [json.loads(l) for l in open(sys.argv[3])]
name = sys.argv[4]
same = valid = valid_same = 0
for c, s, g in zip(ref, corpus, got):
    ok = g == c["ids"]
    same += ok
    if "base64" not in s:
        valid += 1
        valid_same += ok
    if not ok:
        text = s.get("text", "base64:" + s.get("base64", ""))
        print(f"{name}: DIFF {c['name']} {json.dumps(text)[:80]}\n    reference {c['ids'][:24]}\n    llama.cpp {g[:24]}")
print(f"{name}: {same}/{len(got)} strings identical to the reference "
      f"({valid_same}/{valid} valid UTF-8, {same - valid_same}/{len(got) - valid} invalid)")
sys.exit(0 if same == len(got) else 1)
PY
  then
    status=1
  fi
done
exit $status
