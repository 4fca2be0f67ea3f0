#!/usr/bin/env bash
# Corrupt-file corpus test (ctest corrupt_corpus): every input of the fuzz regression corpus that
# the CLI can read is given to the real binary, `strata inspect` and `strata generate -n 1`, under
# a virtual-memory limit and a timeout.
#
# Usage: corrupt_corpus_test.sh STRATA_BIN WORKDIR [--asan]
#
# --asan (the binary is built with AddressSanitizer, which reserves terabytes of address space,
# so `ulimit -v` cannot apply): ASan enforces the limit instead: an RSS over 2 GiB or one
# allocation over 1 GiB ends the run with a fatal ASan report, a failure like any other.
#
# WORKDIR receives the corpus (fuzz/make_corpus.py --big) and the unpacked HF directories. Inputs:
#   gguf/*         a GGUF file, as is
#   hf_dir/*       unpacked into a directory (config.json, model.safetensors, strata_tokenizer.json)
#   safetensors/*  as model.safetensors of a directory whose config.json is a small valid llama
#   big/*          the sparse D4 files (16 MiB .. 1 GiB, a few KiB of disk)
# (archive/* is not read: no command opens a VestigeKV archive file; fuzz_archive covers it.)
# Every run must end by itself with exit 0, or with exit 2 and an "error: " line on stderr that
# is not an internal error (an escaped exception such as std::bad_alloc under the limit is exit 1
# "error: internal: ..."); never a signal, never the timeout. The defect reproducers (d*-*,
# minor-*) must be refused: exit 2. Seeds (seed-*) of gguf/ and hf_dir/ must load: exit 0.
# All failures are listed, then the script exits 1.
set -uo pipefail
bin=${1:?usage: corrupt_corpus_test.sh STRATA_BIN WORKDIR}
work=${2:?usage: corrupt_corpus_test.sh STRATA_BIN WORKDIR}
here=$(cd "$(dirname "$0")" && pwd)
# 1 GiB of address space: the shipped models run in far less (inspect and generate -n 1 of
# models/*.gguf and models/hf/* pass under 512 MiB); each D4/D5 reproducer asks for more.
limit_kib=${STRATA_CORRUPT_LIMIT_KIB:-1048576}
timeout_s=${STRATA_CORRUPT_TIMEOUT_S:-30}
if [ "${3:-}" = "--asan" ]; then
  limit_kib=unlimited
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}soft_rss_limit_mb=2048:max_allocation_size_mb=1024:allocator_may_return_null=1"
  timeout_s=${STRATA_CORRUPT_TIMEOUT_S:-120}
fi

rm -rf "$work"
mkdir -p "$work/dirs"
python3 "$here/make_corpus.py" --strata "$bin" --out "$work" --big >/dev/null || {
  echo "corrupt_corpus: make_corpus.py failed" >&2
  exit 1
}

# A small valid llama config.json for the safetensors inputs (the converter's shape checks decide).
llama_cfg='{"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8,
 "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
 "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 64, "rms_norm_eps": 1e-6}'

# Unpacks one hf_dir input (files joined by fuzz_util.h's kFileSeparator) into directory $2.
unpack() {
  python3 - "$1" "$2" <<'EOF'
import os, sys
sep = b"\n--strata-fuzz-file--\n"
names = ["config.json", "model.safetensors", "strata_tokenizer.json"]
os.makedirs(sys.argv[2], exist_ok=True)
parts = open(sys.argv[1], "rb").read().split(sep, 2)
for name, part in zip(names, parts):
    open(os.path.join(sys.argv[2], name), "wb").write(part)
EOF
}

failures=0 runs=0
# check NAME MODEL EXPECT: runs both commands on MODEL; EXPECT is 0 (must load), 2 (must be
# refused) or any (either, as long as it is clean).
check() {
  local name=$1 model=$2 expect=$3 rc why out
  for cmd in inspect generate; do
    runs=$((runs + 1))
    if [ "$cmd" = inspect ]; then
      set -- "$bin" inspect "$model"
    else
      set -- "$bin" generate -m "$model" -n 1 -p "Hello"
    fi
    out=$( (ulimit -v "$limit_kib"; ulimit -c 0; timeout -k 5 "$timeout_s" "$@" 2>&1 >/dev/null) )
    rc=$?
    why=""
    if ((rc == 124 || rc == 137)); then
      why="timed out after ${timeout_s} s"
    elif ((rc > 128)); then
      why="killed by signal $((rc - 128))"
    elif ((rc != 0 && rc != 2)); then
      why="exit $rc (not a clean refusal)"
    elif ((rc == 2)) && ! grep -q "^error: " <<<"$out"; then
      why="exit 2 without an error message"
    elif ((rc == 2)) && grep -q "^error: internal" <<<"$out"; then
      why="exit 2 with an internal error"
    elif [ "$expect" = 2 ] && ((rc != 2)); then
      why="accepted (exit $rc), must be refused"
    elif [ "$expect" = 0 ] && ((rc != 0)); then
      why="refused (exit $rc), must load"
    fi
    if [ -n "$why" ]; then
      failures=$((failures + 1))
      echo "FAIL $name: strata $cmd: $why"
      [ -n "$out" ] && tail -n 3 <<<"$out" | cut -c1-300 | sed 's/^/    /'
    fi
  done
}

expect_of() {  # seeds must load, reproducers must be refused
  case "$(basename "$1")" in
    seed-*) echo "$2" ;;
    *) echo 2 ;;
  esac
}

for f in "$work"/gguf/* "$work"/big/*; do
  check "$(basename "$(dirname "$f")")/$(basename "$f")" "$f" "$(expect_of "$f" 0)"
done
for f in "$work"/hf_dir/*; do
  d="$work/dirs/hf-$(basename "$f")"
  unpack "$f" "$d"
  check "hf_dir/$(basename "$f")" "$d" "$(expect_of "$f" 0)"
done
for f in "$work"/safetensors/*; do
  d="$work/dirs/st-$(basename "$f")"
  mkdir -p "$d"
  cp "$f" "$d/model.safetensors"
  printf '%s\n' "$llama_cfg" >"$d/config.json"
  check "safetensors/$(basename "$f")" "$d" "$(expect_of "$f" any)"
done

echo "corrupt_corpus: $runs runs, $failures failed (ulimit -v ${limit_kib} KiB, timeout ${timeout_s} s)"
((failures == 0))
