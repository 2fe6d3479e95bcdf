#!/usr/bin/env bash
# Builds and tests the Python and C bindings (called by .ci/run). Needs Rust, gcc and
# CPython >= 3.9; installs maturin and pytest from PyPI into a throwaway venv, and two pinned
# torch versions, the oldest supported (2.11.0) and the newest the registry serves (2.15.0),
# each with the transformers release that supports it (PyPI's wheels, with their CUDA
# libraries: they run on CPU-only machines too) into venvs cached under ~/.cache/attn-policy
# (about 4.7 GB and 1-4 minutes each the first time). Each stage prints its wall seconds.
#   bash bindings/test.sh            # wheel, pytest in a fresh venv, the torch suite on both
#                                    # torch versions, the CP self-check (world 2, 4), C test
#   BENCH=1 bash bindings/test.sh    # also print the Python speed table
#   TORCH_TESTS=0 bash bindings/test.sh   # skip the attn_policy.torch suite
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/bindings}"
export ATTN_POLICY_CORPUS="${ATTN_POLICY_CORPUS:-$ROOT/tests/corpora/te-2.20.2-corpus-a.jsonl.gz}"

# Each stage prints its name and, when the next begins (or the script ends), its wall seconds.
STAGE="" STAGE_T0=$SECONDS
stage() {
  if [[ -n "$STAGE" ]]; then echo "-- stage time: $((SECONDS - STAGE_T0)) s: $STAGE"; fi
  STAGE="$1" STAGE_T0=$SECONDS
  if [[ -n "$STAGE" ]]; then echo "== $STAGE"; fi
}
trap 'stage ""; rm -rf "$WORK"' EXIT

stage "tools venv (maturin, pytest)"
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check 'maturin>=1.9.4,<2'

stage "wheel"
(cd "$ROOT/bindings/python" && "$WORK/tools/bin/maturin" build --release --locked -q -o "$WORK/wheels")

stage "fresh venv: pip install the wheel, pytest"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check "$WORK"/wheels/*.whl pytest
(cd "$WORK" && "$WORK/venv/bin/python" -c 'import attn_policy; print("installed:", attn_policy.__file__)')
(cd "$WORK" && "$WORK/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/bindings/python/tests")
# The attn_policy.torch CPU suite on one torch (and the transformers release that supports it),
# in a venv cached per version: the C++ eager node must build (node: cpp) on each.
torch_suite() {
  local torch_version="$1" transformers_version="$2"
  local pyv tv
  pyv="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
  tv="$HOME/.cache/attn-policy/torch-$torch_version-py$pyv"
  if ! "$tv/bin/python" -c "import torch, pytest, transformers; assert torch.__version__.split('+')[0] == '$torch_version' and transformers.__version__ == '$transformers_version'" 2>/dev/null; then
    rm -rf "$tv" "$tv.tmp"
    # Built beside it and moved in whole, so an interrupted install is never taken as cached
    # (hence `python -m pip`: the venv's own scripts keep the .tmp path).
    "$PY" -m venv "$tv.tmp"
    "$tv.tmp/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version" \
      "transformers==$transformers_version" pytest numpy
    mv "$tv.tmp" "$tv"
  fi
  "$tv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$WORK"/wheels/*.whl
  (cd "$WORK" && "$tv/bin/python" -m attn_policy.eager_node --build --json | tee "$WORK/node.json")
  grep -q '"node": "cpp"' "$WORK/node.json" || { echo "the C++ eager node did not build on torch $torch_version"; exit 1; }
  (cd "$WORK" && "$tv/bin/python" -m pytest -q -p no:cacheprovider \
    "$ROOT/bindings/python/tests/test_torch.py" "$ROOT/bindings/python/tests/test_transformers.py" \
    "$ROOT/bindings/python/tests/test_sdpa.py" "$ROOT/bindings/python/tests/test_context_parallel.py" \
    "$ROOT/bindings/python/tests/test_eager_node.py" "$ROOT/bindings/python/tests/test_torch_inputs.py" \
    "$ROOT/bindings/python/tests/test_chain_walk.py" "$ROOT/bindings/python/tests/test_call_document.py" \
    "$ROOT/bindings/python/tests/test_torch_features.py" "$ROOT/bindings/python/tests/test_torch_varlen.py")
  # torch_flash/torch_efficient's padded and packed paths can be switched off (read once per
  # process): their tests again switched off, where both must refuse lengths naming the variable.
  (cd "$WORK" && ATTN_POLICY_TORCH_VARLEN=0 "$tv/bin/python" -m pytest -q -p no:cacheprovider \
    "$ROOT/bindings/python/tests/test_torch_varlen.py" "$ROOT/bindings/python/tests/test_torch_features.py")
  TV="$tv"
}

if [[ "${TORCH_TESTS:-1}" == 1 ]]; then
  # The oldest supported torch and the newest the registry serves (issue 30, part 5).
  stage "attn_policy.torch: torch 2.11.0 (oldest supported), CPU suite"
  torch_suite 2.11.0 5.17.0
  # Every model family end to end (issue 33) in tiny configs on the CPU: training against two
  # transformers references, generate() of a left-padded batch; exit 1 on any failure.
  (cd "$WORK" && "$TV/bin/python" "$ROOT/bindings/python/bench/models.py" --tiny --device cpu \
    --json "$WORK/models.json")
  stage "attn_policy.torch: torch 2.15.0 (newest), CPU suite"
  torch_suite 2.15.0 5.25.0
  # The model families again against the newest transformers the registry serves.
  (cd "$WORK" && "$TV/bin/python" "$ROOT/bindings/python/bench/models.py" --tiny --device cpu \
    --json "$WORK/models-5.25.json")
  # The context-parallel self-check over gloo, on the newest torch (exit 1 on any failed case).
  for n in 2 4; do
    stage "context-parallel self-check: --world-size $n --device cpu (torch 2.15.0)"
    (cd "$WORK" && "$TV/bin/python" -m attn_policy.cp_check --world-size "$n" --device cpu)
  done
fi
if [[ "${BENCH:-0}" == 1 ]]; then
  stage "bench: Python speed table"
  "$WORK/venv/bin/python" "$ROOT/bindings/python/tests/bench_bindings.py" "$ATTN_POLICY_CORPUS"
fi

stage "C ABI: header snapshot, library, test program"
(cd "$ROOT/bindings/c" && cargo test --release --locked -q && cargo build --release --locked -q)
gcc -O1 -Wall -Wextra -Werror -std=c11 -D_GNU_SOURCE -I"$ROOT/bindings/c/include" \
  "$ROOT/bindings/c/tests/smoke.c" "$CARGO_TARGET_DIR/release/libattn_policy_c.a" \
  -lpthread -ldl -lm -o "$WORK/c_smoke"
"$WORK/c_smoke"
echo "bindings: all passed"
