#!/usr/bin/env bash
# Every speed figure of the embedding in one run, side by side with ratios: Rust (uncached and
# cached decide, thread scaling: `cargo bench --bench cache`, summary only) and Python
# (`select(dict)` and the TE drop-in, from a wheel built and installed into a throwaway venv),
# against TransformerEngine's own selector (~153 us per call). Needs what bindings/test.sh needs.
#   bash bindings/bench.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/bindings}"
CORPUS="${ATTN_POLICY_CORPUS:-$ROOT/tests/corpora/te-2.20.2-corpus-a.jsonl.gz}"

echo "== wheel (maturin in a throwaway venv)"
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check 'maturin>=1.9.4,<2'
(cd "$ROOT/bindings/python" && "$WORK/tools/bin/maturin" build --release --locked -q -o "$WORK/wheels")
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check "$WORK"/wheels/*.whl

echo "== Rust: cargo bench --bench cache (summary)"
uptime
(cd "$ROOT" && ATTN_BENCH_SUMMARY=1 ATTN_BENCH_JSON="$WORK/rust.json" cargo bench -q --bench cache)

echo
echo "== all figures"
uptime
(cd "$WORK" && "$WORK/venv/bin/python" "$ROOT/bindings/python/tests/bench_bindings.py" "$CORPUS" --rust "$WORK/rust.json")
