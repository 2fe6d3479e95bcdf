#!/usr/bin/env bash
# Compiles every variant of the built-in fused kernels (or of a variant file) with NVRTC, as the
# CPU test `nvrtc_compiles_the_variants_for_sm90a` does, and runs `ptxas -v` on each PTX: per
# variant and kernel, the registers, the spill bytes and ptxas' wgmma notes (C7514/C7515: every
# wgmma serialized; C7517: a wait inserted), which no functional test sees. No GPU needed.
#   bash adapters/bench/ptxas_check.sh [VARIANT.cu]
#   ONLY=bf16_512_512 bash adapters/bench/ptxas_check.sh [VARIANT.cu]   # the variants whose name
#                                                       # contains ONLY, much faster
# Needs an NVRTC 13 library and ptxas, e.g. from PyPI's wheels:
#   pip install --target /tmp/nvx nvidia-cuda-nvrtc==13.* nvidia-cuda-nvcc==13.*
#   NVRTC_LIB=/tmp/nvx/nvidia/cu13/lib PTXAS=/tmp/nvx/nvidia/cu13/bin/ptxas bash adapters/bench/ptxas_check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NVRTC_LIB=${NVRTC_LIB:?set NVRTC_LIB to the folder of libnvrtc.so.13}
PTXAS=${PTXAS:-ptxas}
command -v "$PTXAS" >/dev/null || { echo "no ptxas: set PTXAS" >&2; exit 2; }
dump=$(mktemp -d)
trap 'rm -rf "$dump"' EXIT
if [ $# -ge 1 ]; then
  [ -f "$1" ] || { echo "no such variant file: $1" >&2; exit 2; }
  export ATTN_POLICY_FUSED_SOURCE="$(realpath "$1")"
fi
cd "$ROOT"
echo "compiling the variants with NVRTC (all of them: a few minutes)..." >&2
# PTXAS unset for the test: it would fail on the first wgmma note before this table reports it.
env -u PTXAS LD_LIBRARY_PATH="$NVRTC_LIB:${LD_LIBRARY_PATH:-}" ATTN_POLICY_DUMP_PTX="$dump" \
  ATTN_POLICY_NVRTC_ONLY="${ONLY:-}" \
  cargo test -q --release -p attn-policy-adapters --features cuda --lib nvrtc_compiles_the_variants >&2
n=$(find "$dump" -name '*.ptx' | wc -l)
[ "$n" -gt 0 ] || { echo "no PTX dumped: is NVRTC_LIB right? (the test skips without it)" >&2; exit 1; }
printf '%-32s %-12s %5s %12s %12s %s\n' variant kernel regs spill_st_B spill_ld_B wgmma_notes
for f in "$dump"/*.ptx; do
  "$PTXAS" -arch=sm_90a -v "$f" -o /dev/null 2>&1 | python3 -c '
import re, sys
name = sys.argv[1]
notes, kernel, rows = {}, None, {}
for line in sys.stdin:
    m = re.search(r"\((C75\d\d)\).*function .(\w+).", line)
    if m:
        notes.setdefault(m.group(2), []).append(m.group(1))
    m = re.search(r"Compiling entry function .(\w+).", line)
    if m:
        kernel = m.group(1)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and kernel:
        rows.setdefault(kernel, {})["spill"] = (m.group(1), m.group(2))
    m = re.search(r"Used (\d+) registers", line)
    if m and kernel:
        rows.setdefault(kernel, {})["regs"] = m.group(1)
for k in sorted(rows):
    st, ld = rows[k].get("spill", ("0", "0"))
    regs = rows[k].get("regs", "?")
    note = ",".join(notes.get(k, [])) or "-"
    print(f"{name:32s} {k:12s} {regs:>5s} {st:>12s} {ld:>12s} {note}")
' "$(basename "$f" .ptx)"
done
