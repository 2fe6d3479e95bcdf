#!/usr/bin/env bash
# Times fused-kernel variants against the built-in kernel on a GPU machine, alternating processes
# so drift hits every variant alike (docs/fused.md, "Reproduce"). Needs gpu-carry/ (gpu_carry.sh).
#   bash adapters/bench/ab_variants.sh ROUNDS base a=a.cu b=b.cu c=other/attn-bench:c.cu d=other/attn-bench:
# `base` is the built-in kernel; LABEL=FILE compiles FILE through ATTN_POLICY_FUSED_SOURCE (kernels.cu
# and backward.cu, edited); LABEL=BENCH:FILE runs another attn-bench binary (one built from a branch
# whose host code differs), with FILE or, when FILE is empty, its own built-in kernel. SEQLENS
# (default 16384,32768) picks the shapes (b2 hq8 hkv4 causal bf16 d512); ARGS adds attn-bench
# arguments (e.g. ARGS="--head-dim 320"), ARGS_<LABEL> more for that label only (e.g.
# ARGS_rb1="--fused-row-blocks 1" with a label rb1=gpu-carry/attn-bench:). RUNS=DIR keeps each run's JSON there (a call cut short
# still leaves the runs it finished). Prints one line per run as it ends (with max |diff| against
# chunked and the determinism check), then each label's medians.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
rounds=$1
shift
bench_of() { case "${1#*=}" in *:*) echo "${1#*=}" | cut -d: -f1 ;; *) echo gpu-carry/attn-bench ;; esac; }
file_of() { case "$1" in base) ;; *=*:*) echo "${1#*=}" | cut -d: -f2- ;; *) echo "${1#*=}" ;; esac; }
for v in "$@"; do
  f=$(file_of "$v")
  if [ -n "$f" ] && [ ! -f "$f" ]; then echo "no such variant file: $f" >&2; exit 2; fi
  b=$(bench_of "$v")
  [ -x "$b" ] || { echo "no such attn-bench binary: $b" >&2; exit 2; }
done
source gpu-carry/env.sh >/dev/null
runs=${RUNS:-$(mktemp -d)}
mkdir -p "$runs"
[ -n "${RUNS:-}" ] || trap 'rm -rf "$runs"' EXIT
show() {
  python3 - "$@" <<'PY'
import json, sys
label, i, path = sys.argv[1:4]
for r in json.load(open(path)):
    if r["impl"] == "fused":
        # A difference that is not a number (a probe's garbage) is null in the JSON.
        d = " ".join(f"{k}={'nan' if v is None else format(v, '.3g')}"
                     for k, v in r.get("max_abs_diff_vs_chunked", {}).items())
        print(f"{label} {i} s={r['s']} fwd {r['fwd_ms']:.2f} fwd+bwd {r['fwdbwd_ms']:.2f} ms "
              f"peak {r['peak_extra_mib']:.0f} MiB deterministic {r.get('deterministic')} diff {d}")
PY
}
for i in $(seq 1 "$rounds"); do
  for v in "$@"; do
    label=${v%%=*}
    f=$(file_of "$v")
    if [ -n "$f" ]; then
      export ATTN_POLICY_FUSED_SOURCE=$(realpath "$f")
    else
      unset ATTN_POLICY_FUSED_SOURCE
    fi
    extra_var="ARGS_$label"
    # shellcheck disable=SC2086 # ARGS and ARGS_<LABEL> are lists of arguments
    "$(bench_of "$v")" --no-torch --seqlens "${SEQLENS:-16384,32768}" ${ARGS:-} ${!extra_var:-} \
      --json "$runs/$label.$i.json" >/dev/null
    show "$label" "$i" "$runs/$label.$i.json"
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
            rows.setdefault((r["s"], label), []).append((r["fwd_ms"], r["fwdbwd_ms"]))
print(f"# label s: median fwd ms / median fwd+bwd ms over {sys.argv[2]} rounds")
for (s, label), v in sorted(rows.items()):
    print(f"{label} {s}: {statistics.median(x for x, _ in v):.2f} / {statistics.median(y for _, y in v):.2f}")
PY
