#!/usr/bin/env bash
# Builds and tests the Python and C bindings (called by .ci/run). Needs Rust, gcc and
# CPython >= 3.9; installs maturin and pytest from PyPI into a throwaway venv.
#   bash bindings/test.sh            # build wheel, pip install into a fresh venv, pytest, C test
#   BENCH=1 bash bindings/test.sh    # also print the Python speed table
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/bindings}"
export ATTN_POLICY_CORPUS="${ATTN_POLICY_CORPUS:-$ROOT/../shared/conformance/te-2.20.2-corpus-a.jsonl.gz}"

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
