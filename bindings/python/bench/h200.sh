#!/usr/bin/env bash
# Issue 14's GPU proof for attn_policy.torch on the H200, in one command: the GPU pytest suite
# (bindings/python/tests/gpu), the overhead bench (overhead.py) and the Gemma 4 end-to-end script
# (gemma4_train.py), each under its own time limit, logs in $OUT, a short table at the end.
#
# The GPU machine has no Rust and no package registry: build the abi3 wheel here with the GPU
# executors and carry it with the tests and scripts (the device tool sends /work/main plus the
# carried folder), e.g. from the worktree:
#   (cd bindings/python && maturin build --release --locked --features gpu -o /tmp/w)
#   C=/work/main/gpu-carry-torch-path; rm -rf $C; mkdir -p $C
#   cp /tmp/w/*.whl $C/ && cp -r bindings/python/tests bindings/python/bench $C/
#   (and /gpu-carry-torch-path/ in /work/main/.git/info/exclude)
# then, with carry ["gpu-carry-torch-path"], from the repository root there:
#   bash gpu-carry-torch-path/bench/h200.sh gpu-carry-torch-path
# TOTAL_S (default 520) is the time the whole run may take; the Gemma script gets what is left.
set -u
CARRY="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
OUTD="${OUT:-/tmp/out}"; mkdir -p "$OUTD"
TOTAL_S="${TOTAL_S:-520}"
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=$V/cu13/lib:$V/cudnn/lib:$V/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
PY="${PY:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
SITE="${SITE:-/tmp/site}"
"$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$CARRY"/*.whl 2>&1 | tail -2
export PYTHONPATH="$SITE"
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import torch, transformers, attn_policy; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(), "transformers", transformers.__version__, "attn_policy", attn_policy.__file__)'
} > "$OUTD/env.txt" 2>&1
cat "$OUTD/env.txt"

left() { echo $((TOTAL_S - SECONDS)); }

export ATTN_POLICY_REPO="$PWD"  # rules/te for the tests' pack copies
echo "== 1. GPU pytest suite (two processes: a broken kernel in one cannot spoil the other)"
(cd "$CARRY/tests" && GPU_SUMMARY=/tmp/gpu_summary1.txt timeout "${GPU_T:-170}" \
  "$PY" -m pytest -q -s -p no:cacheprovider gpu/test_gpu_torch.py > "$OUTD/gpu_pytest.log" 2>&1)
GPU_RC=$?
echo "gpu pytest (suite) rc=$GPU_RC ($SECONDS s)"
(cd "$CARRY/tests" && GPU_SUMMARY=/tmp/gpu_summary2.txt timeout "${GPU2_T:-120}" \
  "$PY" -m pytest -q -s -p no:cacheprovider gpu/test_gpu_torch_executors.py gpu/test_gpu_torch_features.py \
  >> "$OUTD/gpu_pytest.log" 2>&1)
GPU2_RC=$?
echo "gpu pytest (executors) rc=$GPU2_RC ($SECONDS s)"
cat /tmp/gpu_summary1.txt /tmp/gpu_summary2.txt > "$OUTD/gpu_summary.txt" 2>/dev/null

echo "== 2. overhead bench"
timeout "${BENCH_T:-80}" "$PY" "$CARRY/bench/overhead.py" --json "$OUTD/overhead.json" > "$OUTD/overhead.txt" 2>&1
BENCH_RC=$?
echo "overhead rc=$BENCH_RC ($SECONDS s)"

echo "== 3. Gemma 4 end to end"
G_LEFT=$(left)
# GEMMA_ARGS: extra arguments (a local smoke test: --device cpu --tiny --steps 10)
timeout "$((G_LEFT - 5))" "$PY" "$CARRY/bench/gemma4_train.py" --budget-s "$((G_LEFT - 45))" \
  --json "$OUTD/gemma.json" ${GEMMA_ARGS:-} > "$OUTD/gemma.txt" 2>&1
GEMMA_RC=$?
echo "gemma rc=$GEMMA_RC ($SECONDS s)"

echo "== summary (logs in \$OUT)"
echo "| part | rc |"
echo "|---|---|"
echo "| GPU pytest (suite) | $GPU_RC |"
echo "| GPU pytest (executors) | $GPU2_RC |"
echo "| overhead bench | $BENCH_RC |"
echo "| Gemma 4 | $GEMMA_RC |"
echo "== GPU pytest"
grep -E "[0-9]+ (passed|failed|error)" "$OUTD/gpu_pytest.log"
grep -E "^(FAILED|ERROR)" "$OUTD/gpu_pytest.log" | head -20
echo "== overhead"; grep -E "^\|" "$OUTD/overhead.txt"
echo "== gemma"; grep -E "^\||^steps|^# .*(steps|REDUCED|SDPA)|^total" "$OUTD/gemma.txt"
tail -3 "$OUTD/gemma.txt"
