"""Python-side speed, one run, printed as a table with ratios (not a test: run it directly).

    python bindings/python/tests/bench_bindings.py [CORPUS] [--rust RUST_JSON]

With ``--rust`` (the file `cargo bench --bench cache` writes when ``ATTN_BENCH_JSON`` is
set), the Rust figures are printed in the same table: ``bash bindings/bench.sh`` does both.
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import attn_policy
from attn_policy import te

TE_US = 153.0


def median_us(fn, args, rounds=15, batch=2000):
    samples = []
    n = len(args)
    for r in range(rounds):
        t = time.perf_counter()
        for k in range(batch):
            fn(args[(r * batch + k) % n])
        samples.append((time.perf_counter() - t) / batch * 1e6)
    return statistics.median(samples)


def main():
    default = Path(__file__).resolve().parents[3] / "tests/corpora/te-2.20.2-corpus-a.jsonl.gz"
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus", nargs="?", default=str(default))
    ap.add_argument("--rust", help="JSON written by `cargo bench --bench cache` (ATTN_BENCH_JSON)")
    args = ap.parse_args()
    recs = []
    with gzip.open(args.corpus, "rt") as f:
        for line in f:
            recs.append(json.loads(line))
            if len(recs) >= 256:
                break
    cfgs = [r["config"] for r in recs]
    nss = [types.SimpleNamespace(**c) for c in cfgs]
    # Environment facts given per call, as a framework that resolved them itself would.
    env = dict(device_compute_capability=(9, 0), cudnn_version=(9, 12, 0), flash_attn_versions={"v2": "2.8.3"})
    p = attn_policy.Policy.load("te")
    te.set_policy(p)
    for c in cfgs:
        p.select(c)
    for ns in nss:
        te.get_attention_backend(ns, frost=False)
        te.get_attention_backend(ns, frost=False, **env)
    rows = []
    rows.append(("Python policy.select(dict), cached", median_us(p.select, cfgs), 5.0))
    rows.append(("Python policy.select(dict).selected, cached", median_us(lambda c: p.select(c).selected, cfgs), None))
    rows.append(("TE drop-in get_attention_backend(params), cached", median_us(lambda ns: te.get_attention_backend(ns, frost=False), nss), 10.0))
    rows.append(
        (
            "TE drop-in get_attention_backend(params, **env), cached",
            median_us(lambda ns: te.get_attention_backend(ns, frost=False, **env), nss),
            10.0,
        )
    )
    stats = p.cache_stats()
    rust = []
    if args.rust:
        with open(args.rust) as f:
            r = json.load(f)
        rust = [
            ("Rust uncached decide (complete decision)", r["uncached_ns"] / 1e3, 2.0),
            ("Rust cached decide, hit (Facts reused)", r["cached_hit_ns"] / 1e3, 0.1),
            ("Rust cached lookup, hit (key encoded per call)", r["cached_hit_fresh_key_ns"] / 1e3, None),
            ("Rust Facts::from_json + cached decide", r["from_json_cached_ns"] / 1e3, None),
        ]
    print(f"== attn-policy speed ({len(cfgs)} corpus configs; TE's own selector: ~{TE_US:.0f} us median per call) ==")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    print(f"{'measure':<58} {'median':>10} {'target':>9} {'met':>4} {'TE/this':>9}")
    for name, us, target in rust + rows:
        val = f"{us * 1e3:7.0f} ns" if us < 1 else f"{us:7.2f} us"
        tgt = "" if target is None else (f"{target * 1e3:.0f} ns" if target < 1 else f"{target:.0f} us")
        met = "" if target is None else ("yes" if us <= target else "NO")
        print(f"{name:<58} {val:>10} {tgt:>9} {met:>4} {TE_US / us:8.0f}x")
    if args.rust:
        print(f"Rust threads: {r.get('threads', {})}")
    print(f"Python cache: {stats}")


if __name__ == "__main__":
    main()
