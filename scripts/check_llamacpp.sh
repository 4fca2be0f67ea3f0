#!/usr/bin/env bash
# Loads GGUF files Strata writes in llama.cpp and compares greedy text with `strata generate`.
#
# Issue 17 part 5: every GGUF Strata writes (synth, convert, quantize) must load in llama.cpp and
# give the same greedy continuation. Not part of CI (llama.cpp is not installed there): without a
# llama.cpp build it prints why and exits 0.
#
# Usage: LLAMA_CPP_BIN=DIR scripts/check_llamacpp.sh [FILE.gguf ...]
#   LLAMA_CPP_BIN  folder holding llama-completion (or llama-cli), e.g. a llama.cpp build's bin/
#   STRATA         the strata binary (default: build/release/strata)
#   PROMPT         the prompt (default: "The quick brown fox"); N tokens (default 40)
#   QUANT_TYPES    with no files given and `strata quantize` present, also check the synth llama
#                  and deepseek2 models quantized to these types (default: Q8_0 Q4_0 Q4_K_M Q6_K)
# With no files it synthesizes the default set (each arch, deepseek2 with and without the NoPE
# branch, dense and MoE, with a q LoRA, a `strata convert` output) into a temporary folder.
# Greedy text is compared byte for byte (neither engine prints token ids), strata with an f16 KV
# cache like llama.cpp's default: a load failure or a different continuation is FAIL, except for
# NoPE files (mla_use_nope), which llama.cpp loads but computes as RoPE ("n/a"). For quantized
# files the "deq" column also runs llama.cpp on its own F32 dequantization of the file (format
# fidelity without llama.cpp's 8-bit activation rounding, which alone can flip near-ties). A file
# without a tokenizer is only loaded (by llama-bench).
# Exit status: 1 if any FAIL, else 0.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
strata="${STRATA:-$root/build/release/strata}"
prompt="${PROMPT:-The quick brown fox}"
n="${N:-40}"

if [[ -z "${LLAMA_CPP_BIN:-}" ]]; then
  echo "check_llamacpp: SKIP: LLAMA_CPP_BIN is not set (a folder with llama-completion)"
  exit 0
fi
llama=""
for b in llama-completion llama-cli; do
  if [[ -x "$LLAMA_CPP_BIN/$b" ]]; then llama="$LLAMA_CPP_BIN/$b"; break; fi
done
if [[ -z "$llama" ]]; then
  echo "check_llamacpp: SKIP: no llama-completion or llama-cli in LLAMA_CPP_BIN=$LLAMA_CPP_BIN"
  exit 0
fi
if [[ ! -x "$strata" ]]; then
  echo "check_llamacpp: $strata is not built (cmake --build --preset release --target strata)" >&2
  exit 2
fi

tmp="$(mktemp -d /tmp/strata-llamacpp-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then
  synth() {  # NAME ARGS...: a synth GGUF at $tmp/NAME.gguf
    local name="$1"; shift
    if "$strata" synth "$@" -o "$tmp/$name.gguf" >"$tmp/$name.synth.log" 2>&1; then
      files+=("$tmp/$name.gguf")
    else
      echo "check_llamacpp: strata synth $* failed:" >&2; cat "$tmp/$name.synth.log" >&2
      files+=("$tmp/$name.gguf")  # reported as a FAIL below
    fi
  }
  synth llama --arch llama
  synth qwen2 --arch qwen2
  synth deepseek2-dense --arch deepseek2 --dims experts=0
  synth deepseek2-dense-nope --arch deepseek2 --nope --dims experts=0
  synth deepseek2-moe --arch deepseek2
  synth deepseek2-moe-nope --arch deepseek2 --nope
  synth deepseek2-moe-qlora --arch deepseek2 --dims q_lora=16
  synth llama-f32 --arch llama --dtype f32
  synth llama-q8_0 --arch llama --dtype q8_0
  # A `strata convert` output: an HF checkpoint written by synth, converted.
  if "$strata" synth --arch deepseek2 --format safetensors -o "$tmp/hf-ds" >/dev/null 2>&1 &&
     "$strata" convert "$tmp/hf-ds" -o "$tmp/convert-deepseek2.gguf" >/dev/null 2>&1; then
    files+=("$tmp/convert-deepseek2.gguf")
  fi
  if [[ -d "$root/models/hf/gqa" ]] &&
     "$strata" convert "$root/models/hf/gqa" -o "$tmp/convert-gqa.gguf" >/dev/null 2>&1; then
    files+=("$tmp/convert-gqa.gguf")
  fi
  if "$strata" quantize --help >/dev/null 2>&1; then
    # Row lengths a multiple of 256 so no K-quant tensor falls back to another type.
    "$strata" synth --arch llama --dims d_model=256,heads=4,kv_heads=2,head_dim=64,ff=512 \
      -o "$tmp/q-base-llama.gguf" >/dev/null 2>&1
    "$strata" synth --arch deepseek2 --dims d_model=256,heads=4,kv_lora=256,nope_dim=32,rope_dim=32,v_dim=64,ff=512,ff_expert=256 \
      -o "$tmp/q-base-deepseek2.gguf" >/dev/null 2>&1
    for base in llama deepseek2; do
      for t in ${QUANT_TYPES:-Q8_0 Q4_0 Q4_K_M Q6_K}; do
        out="$tmp/quantize-$base-$t.gguf"
        "$strata" quantize "$tmp/q-base-$base.gguf" "$out" --type "$t" >/dev/null 2>&1
        files+=("$out")
      done
    done
  fi
fi

# llama-completion prints through an asynchronous log thread; on a loaded machine its stdout was
# seen cut short (no closing newlines) once in a few runs: such a run is repeated, up to 3 times.
run_llama() {  # FILE -> $tmp/l.out, $tmp/l.err; returns llama's exit status
  local rc=0
  for _ in 1 2 3; do
    "$llama" -m "$1" -p "$prompt" -n "$n" --temp 0 -t 1 --no-warmup --no-display-prompt \
      -no-cnv --seed 1 "${extra[@]}" </dev/null >"$tmp/l.out" 2>"$tmp/l.err"
    rc=$?
    [[ $rc -ne 0 || "$(tail -c 2 "$tmp/l.out" | od -An -c | tr -d ' ')" == '\n\n' ]] && break
  done
  return $rc
}

# Raw bytes on both sides (byte tokens need not be UTF-8). strata prints the prompt, the text and
# a newline; llama-completion (--no-display-prompt) the text and two newlines, or after an EOS
# (where strata stops silently) " [end of text]" and newlines.
compare() {
  python3 - "$tmp/s.out" "$tmp/l.out" "$prompt" <<'EOF'
import sys
s = open(sys.argv[1], "rb").read()
l = open(sys.argv[2], "rb").read()
p = sys.argv[3].encode()
if s.startswith(p):
    s = s[len(p):]
if s.endswith(b"\n"):
    s = s[:-1]
s = s.replace(b"\0", b"")  # llama.cpp prints pieces as C strings: the byte token <0x00> is lost
eot = l.rfind(b" [end of text]")
if eot >= 0 and not l[eot + 14:].strip(b"\n"):
    l = l[:eot]
elif l.endswith(b"\n\n"):  # its exit prints two newlines after the text
    l = l[:-2]
if s == l:
    print("identical, %d bytes" % len(s))
else:
    i = next((k for k in range(min(len(s), len(l))) if s[k] != l[k]), min(len(s), len(l)))
    print("same first %d of %d/%d bytes, then strata %r | llama.cpp %r"
          % (i, len(s), len(l), s[i:i + 8], l[i:i + 8]))
EOF
}

fmt='%-30s %-10s %-5s %-6s %-5s %s\n'
fails=0
printf "$fmt" file arch load greedy deq note
for f in "${files[@]}"; do
  name="$(basename "$f")"
  if [[ ! -f "$f" ]]; then
    printf "$fmt" "$name" "?" "FAIL" "-" "-" "not written"
    fails=$((fails + 1)); continue
  fi
  arch="?" nope="False" quant="False" vocab="True"
  if "$strata" inspect "$f" --json "$tmp/i.json" >/dev/null 2>&1; then
    read -r arch nope quant vocab < <(python3 -c 'import json,sys; d = json.load(open(sys.argv[1]))
q = any(t["type"] not in ("F32", "F16", "BF16") for t in d["tensors"])
print(d["config"]["architecture"], d["config"].get("mla_nope", False), q, d["tokenizer"] is not None)' \
      "$tmp/i.json")
  fi
  if [[ "$vocab" == False ]]; then
    # No tokenizer (tokenizer.ggml.model "none"): neither engine takes a text prompt, so only
    # loading is checked, with llama-bench (one generated token from llama.cpp's own ids).
    if [[ -x "$LLAMA_CPP_BIN/llama-bench" ]] &&
       "$LLAMA_CPP_BIN/llama-bench" -m "$f" -p 0 -n 1 -t 1 -r 1 >"$tmp/b.out" 2>&1; then
      printf "$fmt" "$name" "$arch" "PASS" "n/a" "-" "no tokenizer: loaded and ran by llama-bench"
    else
      printf "$fmt" "$name" "$arch" "FAIL" "n/a" "-" \
        "no tokenizer; llama-bench: $(grep -m1 -iE 'error|failed' "$tmp/b.out" | cut -c1-90)"
      fails=$((fails + 1))
    fi
    continue
  fi
  extra=()
  # deepseek2: llama.cpp's CPU repacking changes nothing here but costs time on tiny files.
  [[ "$arch" == deepseek2 ]] && extra+=(--no-repack)
  # --kv-type f16: llama.cpp's default cache type (strata's default bf16 rounds K and V more coarsely
  # and flips near-ties of random-weight models within 40 tokens).
  "$strata" generate -m "$f" -p "$prompt" -n "$n" --temp 0 --threads 1 --kv-type f16 \
    >"$tmp/s.out" 2>"$tmp/s.err"
  s_rc=$?
  if ! run_llama "$f"; then
    why="$(grep -m1 -iE 'error|failed|missing|key not found' "$tmp/l.err" | cut -c1-110)"
    printf "$fmt" "$name" "$arch" "FAIL" "-" "-" "llama.cpp: ${why:-exit status not 0}"
    fails=$((fails + 1)); continue
  fi
  if [[ $s_rc -ne 0 ]]; then
    printf "$fmt" "$name" "$arch" "PASS" "FAIL" "-" "strata: $(head -c 90 "$tmp/s.err")"
    fails=$((fails + 1)); continue
  fi
  note="$(compare)"
  greedy=FAIL
  [[ "$note" == identical* ]] && greedy=PASS
  # Quantized files: llama.cpp rounds activations to 8-bit blocks in its quantized matmuls, which
  # flips near-ties of random-weight models. The "deq" column separates that from the format: the
  # file dequantized by llama.cpp itself (llama-quantize --allow-requantize FILE OUT F32), run in
  # llama.cpp, against strata on the quantized file.
  deq="-"
  if [[ "$quant" == True && -x "$LLAMA_CPP_BIN/llama-quantize" ]]; then
    deq=FAIL
    if "$LLAMA_CPP_BIN/llama-quantize" --allow-requantize "$f" "$tmp/deq.gguf" F32 1 \
         >"$tmp/q.log" 2>&1 && run_llama "$tmp/deq.gguf"; then
      dnote="$(compare)"
      [[ "$dnote" == identical* ]] && deq=PASS
      [[ "$greedy" == PASS ]] || note="$note; deq: $dnote"
    fi
  fi
  if [[ "$greedy" == PASS && "$deq" != FAIL ]]; then
    printf "$fmt" "$name" "$arch" "PASS" "PASS" "$deq" "$note"
  elif [[ "$nope" == True ]]; then
    # llama.cpp has no NoPE branch: it rotates the rope part as for the RoPE twin, so the
    # continuations differ by design. Loading is what is checked.
    printf "$fmt" "$name" "$arch" "PASS" "n/a" "$deq" \
      "mla_use_nope: llama.cpp ignores the key (rotates); $note"
  else
    printf "$fmt" "$name" "$arch" "PASS" "$greedy" "$deq" "$note"
    fails=$((fails + 1))
  fi
done
echo "check_llamacpp: ${#files[@]} files, $fails failed"
[[ $fails -eq 0 ]]
