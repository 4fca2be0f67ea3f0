#!/usr/bin/env bash
# Runs the testbed tests (tools/testbed/test_testbed.py) for ctest: export layout, the engine's
# MLA/llama conventions against an f64 reference, checkpoint/resume, and - when a strata binary
# with `convert` and `logits` exists - logit parity with the engine on three random models.
# Usage: bash tools/testbed/test_parity.sh [STRATA_BIN]
# Exit 0 with "skipped: ..." when no Python with torch is available.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] && [ -n "$1" ] && export STRATA_BIN="$1"
py=""
for c in /usr/bin/python3 python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" >/dev/null 2>&1; then
    py="$c"
    break
  fi
done
if [ -z "$py" ]; then
  echo "skipped: torch is not importable (Debian python3-torch for /usr/bin/python3)"
  exit 0
fi
exec "$py" "$here/test_testbed.py" -v
