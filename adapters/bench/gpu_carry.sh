#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs to test and time the CUDA executors,
# into the git-ignored folder gpu-carry/ (name it in the device tool's `carry`):
#   gpu-carry/<test>        every adapters integration test (gpu_fused, gpu_chunked, cudnn_gpu, ...)
#   gpu-carry/attn-bench    the fused/chunked/SDPA benchmark
#   gpu-carry/attn-policy   the CLI with the cuDNN executor (`run`)
#   gpu-carry/env.sh        `source` it on the GPU machine: library paths, cuDNN 9.19 first
#   gpu-carry/variants/     each kernel variant of adapters/bench/variants/ that applies to
#                           today's kernels.cu + backward.cu, as a .cu for ATTN_POLICY_FUSED_SOURCE
# Release builds with `--features cudnn`, stripped (about 30 MiB in all). Usage:
#   bash adapters/bench/gpu_carry.sh            # CARGO_TARGET_DIR is honoured
# On the GPU machine:
#   source gpu-carry/env.sh && gpu-carry/gpu_fused --test-threads 1 --nocapture
#   ATTN_POLICY_FUSED_SOURCE=variant.cu gpu-carry/attn-bench --no-torch --seqlens 16384
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$ROOT/gpu-carry"
mkdir -p "$OUT"
cd "$ROOT"
echo "== test executables" >&2
cargo test --release -p attn-policy-adapters --features cudnn --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' \
  | while read -r name exe; do cp "$exe" "$OUT/$name"; strip "$OUT/$name"; echo "  $name" >&2; done
echo "== attn-bench, attn-policy" >&2
cargo build --release -p attn-policy-adapters --features cudnn --bin attn-bench
cargo build --release -p attn-policy-cli --features cudnn
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
for b in attn-bench attn-policy; do cp "$TARGET/release/$b" "$OUT/$b"; strip "$OUT/$b"; done
# The GPU machine's library paths (docs/run-h200.md names the cuDNN it loads): torch's CUDA 13 wheels, and a
# `libcudnn.so` link to torch's cuDNN 9.19 ahead of the system's 9.14.
cat > "$OUT/env.sh" <<'ENV'
V=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
mkdir -p "$HOME/cudnn919" && ln -sf "$V/cudnn/lib/libcudnn.so.9" "$HOME/cudnn919/libcudnn.so"
export LD_LIBRARY_PATH="$HOME/cudnn919:$V/cu13/lib:$V/cudnn/lib:$V/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ENV
echo "== kernel variants" >&2
rm -rf "$OUT/variants"
mkdir -p "$OUT/variants"
for p in adapters/bench/variants/*.patch; do
  n=$(basename "$p" .patch)
  cat adapters/src/fused/kernels.cu adapters/src/fused/backward.cu > "$OUT/variants/$n.cu"
  # Host-code patches, and kernel patches made against older kernels, do not apply: skipped.
  if patch -s -F0 --dry-run "$OUT/variants/$n.cu" "$p" >/dev/null 2>&1; then
    patch -s -F0 --no-backup-if-mismatch "$OUT/variants/$n.cu" "$p"
    echo "  $n" >&2
  else
    rm "$OUT/variants/$n.cu"
    echo "  $n: does not apply to today's kernels (host code, or stale): skipped" >&2
  fi
done
du -sh "$OUT" >&2
