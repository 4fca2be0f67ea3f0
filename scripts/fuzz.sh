#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for SECONDS,
# one after the other, on top of the seed and regression corpora that fuzz/make_corpus.py
# generates (from `strata synth` and the shipped models; a release `strata` is built when absent).
#
# Usage: bash scripts/fuzz.sh [--seeds-only] [SECONDS] [TARGET...]
#   SECONDS   time per target (default 60); TARGETs: gguf safetensors hf_dir archive tokenizer
#             request chat_template quant_dot (default all)
#   --seeds-only  start from the seed-* inputs only, leaving out the defect reproducers (d*-*,
#                 minor-*): for a long run while a reproducer's fix is still pending
# New inputs the fuzzer finds go to build/fuzz/work/TARGET (kept between runs, so a later run goes
# on from there); a crash stops that target, leaves its input in build/fuzz/artifacts/ and makes
# the script exit 1. One summary line per target: seconds, executions, crashes.
# Without clang++ it prints why and exits 0 (the fuzz build is optional; CI images have clang).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds_only=0
if [ "${1:-}" = "--seeds-only" ]; then
  seeds_only=1
  shift
fi
secs=${1:-60}
shift || true
targets=("$@")
all_targets=(gguf safetensors hf_dir archive tokenizer request chat_template quant_dot)
((${#targets[@]})) || targets=("${all_targets[@]}")
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found, fuzz targets not built (scripts/setup.sh installs clang)" >&2
  exit 0
fi

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
if [ ! -x build/release/strata ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release --target strata
fi
corpus=build/fuzz/corpus
python3 fuzz/make_corpus.py --strata build/release/strata --out "$corpus" >/dev/null

status=0
mkdir -p build/fuzz/artifacts
for t in "${targets[@]}"; do
  bin=build/fuzz/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' (${all_targets[*]})" >&2; exit 2; }
  work=build/fuzz/work/$t
  mkdir -p "$work"
  inputs=("$corpus/$t")
  if ((seeds_only)); then
    inputs=(build/fuzz/seeds/$t)
    rm -rf "${inputs[0]}" && mkdir -p "${inputs[0]}"
    cp "$corpus/$t"/seed-* "${inputs[0]}/"
  fi
  log=build/fuzz/$t.log
  # fuzz_hf_dir's and fuzz_tokenizer's scratch directory: libFuzzer ends with _Exit, so no
  # destructor removes it.
  export TMPDIR=$PWD/build/fuzz/tmp
  rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
  # -max_len: the shipped models (1.3-1.5 MiB) are seeds of the file readers, trimmed real
  # tokenizer.json files (up to 200 KiB) of fuzz_tokenizer; request bodies, chat templates and
  # quantized rows stay far below 64 KiB. -timeout: an input that runs 25 s is a finding (a
  # hang); -rss_limit_mb: an input that makes a harness use more is a finding (ASan's own
  # overhead included).
  case $t in
    request | chat_template | quant_dot) max_len=65536 ;;
    *) max_len=2097152 ;;
  esac
  set +e
  "$bin" "$work" "${inputs[@]}" -max_total_time="$secs" -max_len=$max_len -timeout=25 \
    -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix=build/fuzz/artifacts/"$t"- \
    > "$log" 2>&1
  rc=$?
  set -e
  rm -rf "$TMPDIR"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -1)
  if ((rc == 0)); then
    echo "fuzz $t: ${took:-$secs} s, ${execs:-?} executions, 0 crashes (log: $log)"
  else
    status=1
    echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions, 1 crash; log: $log" >&2
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -5 >&2 || true
  fi
done
exit $status
