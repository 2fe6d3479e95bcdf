#!/usr/bin/env bash
# Times fused-kernel variants against the built-in kernel on a GPU machine, alternating processes
# so drift hits every variant alike (docs/fused.md, "Reproduce"). Needs gpu-carry/ (gpu_carry.sh).
#   bash adapters/bench/ab_variants.sh ROUNDS base a=a.cu b=b.cu
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
runs=$(mktemp -d)
for i in $(seq 1 "$rounds"); do
  for v in "$@"; do
    label=${v%%=*}
    if [ "$label" = base ]; then
      unset ATTN_POLICY_FUSED_SOURCE
    else
      export ATTN_POLICY_FUSED_SOURCE=$(realpath "${v#*=}")
    fi
    gpu-carry/attn-bench --no-torch --seqlens "${SEQLENS:-16384,32768}" --json "$runs/$label.$i.json" >/dev/null
  done
done
unset ATTN_POLICY_FUSED_SOURCE
python3 - "$runs" "$rounds" <<'PY'
import json, pathlib, statistics, sys
rows = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    label, i = path.stem.rsplit(".", 1)
    for r in json.loads(path.read_text()):
        if r["impl"] == "fused":
            print(f"{label} {i} s={r['s']} fwd {r['fwd_ms']:.2f} fwd+bwd {r['fwdbwd_ms']:.2f} ms peak {r['peak_extra_mib']:.0f} MiB")
            rows.setdefault((r["s"], label), []).append((r["fwd_ms"], r["fwdbwd_ms"]))
print(f"# label s: median fwd ms / median fwd+bwd ms over {sys.argv[2]} rounds")
for (s, label), v in sorted(rows.items()):
    print(f"{label} {s}: {statistics.median(x for x, _ in v):.2f} / {statistics.median(y for _, y in v):.2f}")
PY
rm -rf "$runs"
