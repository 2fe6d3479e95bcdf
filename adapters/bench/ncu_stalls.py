"""Where a kernel's warps wait: the instructions with the most warp-stall samples in an Nsight
Compute report's source page (docs/fused.md, "Reproduce").

    ncu -k regex:fused_fwd -c 1 --set full -o prof attn-bench --no-torch --seqlens 16384 --iters 1
    ncu -i prof.ncu-rep --page source --csv > source.csv
    python3 adapters/bench/ncu_stalls.py source.csv [--top 40]

Prints the total of the "Warp Stall Sampling (All Samples)" column, the number of SASS
instructions, and the top instructions by samples with their share. Standard library only, so it
runs on the GPU machine as it is.
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import List, Tuple

SAMPLES = "Warp Stall Sampling (All"


def samples_by_instruction(path: str) -> List[Tuple[int, str]]:
    """(samples, SASS text) per instruction row of the source page's CSV."""
    try:
        with open(path, newline="", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror}")
    try:
        head = next(i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r))
    except StopIteration:
        raise SystemExit(f"{path}: no header row with a 'Source' column (is it `--page source --csv`?)")
    header = rows[head]
    src = next(i for i, c in enumerate(header) if c.strip() == "Source")
    try:
        smp = next(i for i, c in enumerate(header) if SAMPLES in c)
    except StopIteration:
        raise SystemExit(f"{path}: no '{SAMPLES} ...)' column (profile with --set full)")
    out = []
    for r in rows[head + 1:]:
        if len(r) <= max(src, smp):
            continue
        try:
            n = int(float(r[smp].replace(",", "") or 0))
        except ValueError:
            continue
        out.append((n, r[src].strip()))
    return out


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="`ncu -i REPORT --page source --csv` output")
    ap.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    a = ap.parse_args(argv)
    data = samples_by_instruction(a.csv)
    total = sum(n for n, _ in data)
    print(f"total samples {total} instructions {len(data)}")
    for n, text in sorted(data, key=lambda x: -x[0])[: a.top]:
        print(f"{n:8d} {100 * n / max(total, 1):5.1f}%  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
