"""Python-side speed, one run, printed as a table with ratios (not a test: run it directly).

    python bindings/python/tests/bench_bindings.py
"""
import gzip
import json
import statistics
import sys
import threading
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
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "../shared/conformance/te-2.20.2-corpus-a.jsonl.gz"
    recs = []
    with gzip.open(corpus, "rt") as f:
        for line in f:
            recs.append(json.loads(line))
            if len(recs) >= 256:
                break
    cfgs = [r["config"] for r in recs]
    nss = [types.SimpleNamespace(**c) for c in cfgs]
    p = attn_policy.Policy.load("te")
    te.set_policy(p)
    for c in cfgs:
        p.select(c)
    for ns in nss:
        te.get_attention_backend(ns, frost=False)
    sel = median_us(p.select, cfgs)
    sel_t = median_us(lambda c: p.select(c).selected, cfgs)
    drop = median_us(lambda ns: te.get_attention_backend(ns, frost=False), nss)
    print(f"== attn-policy Python bindings ({len(cfgs)} corpus configs, cached) ==")
    print(f"policy.select(dict)                 {sel:8.2f} us   ({TE_US / sel:5.1f}x faster than TE's {TE_US:.0f} us)")
    print(f"policy.select(dict).selected        {sel_t:8.2f} us")
    print(f"te.get_attention_backend(params)    {drop:8.2f} us   ({TE_US / drop:5.1f}x faster than TE's {TE_US:.0f} us)")
    print(f"cache: {p.cache_stats()}")


if __name__ == "__main__":
    main()
