#!/usr/bin/env bash
# Builds Strata and runs its test suite. `--asan` uses the AddressSanitizer + UBSan build instead.
# Usage: bash scripts/test.sh [--asan]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
[ "${1:-}" = "--asan" ] && preset=asan
bash scripts/setup.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
