#!/usr/bin/env bash
# Times fused-kernel variants against the built-in kernel on a GPU machine, alternating processes
# so drift hits every variant alike (docs/fused.md, "Reproduce"). Needs gpu-carry/ (gpu_carry.sh).
#   bash adapters/bench/ab_variants.sh ROUNDS base pv=pv.cu pvpoly=pvpoly.cu
# `base` is the built-in kernel; LABEL=FILE compiles FILE through ATTN_POLICY_FUSED_SOURCE (kernels.cu
# and backward.cu, edited). SEQLENS (default 16384,32768) picks the shapes (b2 hq8 hkv4 causal bf16
# d512). Prints one line per run, then each label's median forward and forward+backward per length.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,7p' "$0"; exit 2; }
rounds=$1
shift
for v in "$@"; do
  if [ "${v%%=*}" != base ] && [ ! -f "${v#*=}" ]; then echo "no such variant file: ${v#*=}" >&2; exit 2; fi
done
source gpu-carry/env.sh >/dev/null
runs=$(mktemp)
for i in $(seq 1 "$rounds"); do
  for v in "$@"; do
    label=${v%%=*}
    if [ "$label" = base ]; then
      unset ATTN_POLICY_FUSED_SOURCE
    else
      export ATTN_POLICY_FUSED_SOURCE=$(realpath "${v#*=}")
    fi
    # attn-bench repeats earlier lengths' rows in later tables: keep each row once.
    gpu-carry/attn-bench --no-torch --seqlens "${SEQLENS:-16384,32768}" 2>&1 \
      | awk -F'|' -v l="$label" -v i="$i" '/^\| fused/ {gsub(/ /, ""); print l, i, $3, $4, $5, $6}' \
      | sort -u | tee -a "$runs"
  done
done
unset ATTN_POLICY_FUSED_SOURCE
echo "# label s: median fwd ms / median fwd+bwd ms over $rounds rounds"
python3 - "$runs" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, _, s, fwd, fb, _peak = line.split()
    rows.setdefault((label, int(s)), []).append((float(fwd), float(fb)))
for (label, s), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{label} {s}: {statistics.median(x for x, _ in v):.2f} / {statistics.median(y for _, y in v):.2f}")
PY
rm -f "$runs"
