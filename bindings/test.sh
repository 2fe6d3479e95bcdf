#!/usr/bin/env bash
# Builds and tests the Python and C bindings (called by .ci/run). Needs Rust, gcc and
# CPython >= 3.9; installs maturin and pytest from PyPI into a throwaway venv, and a pinned
# torch (PyPI's wheel, with its CUDA libraries: it runs on CPU-only machines too) into a venv
# cached under ~/.cache/attn-policy (about 4.7 GB, 3-4 minutes the first time).
#   bash bindings/test.sh            # build wheel, pip install into a fresh venv, pytest, C test
#   BENCH=1 bash bindings/test.sh    # also print the Python speed table
#   TORCH_TESTS=0 bash bindings/test.sh   # skip the attn_policy.torch suite
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/bindings}"
export ATTN_POLICY_CORPUS="${ATTN_POLICY_CORPUS:-$ROOT/tests/corpora/te-2.20.2-corpus-a.jsonl.gz}"

echo "== tools venv (maturin, pytest)"
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check 'maturin>=1.9.4,<2'

echo "== wheel"
(cd "$ROOT/bindings/python" && "$WORK/tools/bin/maturin" build --release --locked -q -o "$WORK/wheels")

echo "== fresh venv: pip install the wheel, pytest"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check "$WORK"/wheels/*.whl pytest
(cd "$WORK" && "$WORK/venv/bin/python" -c 'import attn_policy; print("installed:", attn_policy.__file__)')
(cd "$WORK" && "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/bindings/python/tests")
if [[ "${TORCH_TESTS:-1}" == 1 ]]; then
  echo "== attn_policy.torch: pinned torch in a cached venv, CPU test suite"
  TORCH_VERSION=2.11.0
  PYV="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
  TV="${ATTN_POLICY_TORCH_VENV:-$HOME/.cache/attn-policy/torch-$TORCH_VERSION-py$PYV}"
  if ! "$TV/bin/python" -c "import torch, pytest; import transformers; assert torch.__version__.split('+')[0] == '$TORCH_VERSION'" 2>/dev/null; then
    rm -rf "$TV"
    "$PY" -m venv "$TV"
    "$TV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" "transformers==5.17.0" pytest numpy
  fi
  "$TV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WORK"/wheels/*.whl
  (cd "$WORK" && "$TV/bin/python" -m pytest -q -p no:cacheprovider \
    "$ROOT/bindings/python/tests/test_torch.py" "$ROOT/bindings/python/tests/test_transformers.py" \
    "$ROOT/bindings/python/tests/test_sdpa.py" "$ROOT/bindings/python/tests/test_context_parallel.py" \
    "$ROOT/bindings/python/tests/test_eager_node.py")
fi
if [[ "${BENCH:-0}" == 1 ]]; then
  "$WORK/venv/bin/python" "$ROOT/bindings/python/tests/bench_bindings.py" "$ATTN_POLICY_CORPUS"
fi

echo "== C ABI: header snapshot, library, test program"
(cd "$ROOT/bindings/c" && cargo test --release --locked -q && cargo build --release --locked -q)
gcc -O1 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -I"$ROOT/bindings/c/include" \
  "$ROOT/bindings/c/tests/smoke.c" "$CARGO_TARGET_DIR/release/libattn_policy_c.a" \
  -lpthread -ldl -lm -o "$WORK/c_smoke"
"$WORK/c_smoke"
echo "bindings: all passed"
