//! Decision cache benchmark, in one run: uncached `decide_into` (the complete decision an
//! explanation renders from), the same with the `explain/v1` JSON built, a cached lookup, and
//! 1/2/4/8/16 threads deciding concurrently through one shared cache. Criterion reports each
//! figure with its confidence interval; a summary table with medians and ratios follows.
//!
//! Inputs: 512 configurations of `tests/corpora/te-2.20.2-corpus-a.jsonl.gz` when it
//! is there (else the presets). `cargo bench --bench cache`.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use attn_policy::Decision;
use attn_policy::{CachedPolicy, FactsKey};
use attn_policy::{Explanation, Facts, Policy};
use criterion::{Criterion, criterion_group};

const TE_PYTHON_US: f64 = 153.0;

/// The raw configs behind [`inputs`] (for the from-JSON figure).
fn configs() -> Vec<serde_json::Value> {
    let corpus =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpora/te-2.20.2-corpus-a.jsonl.gz");
    match attn_policy::read_corpus(&corpus) {
        Ok(recs) => recs
            .iter()
            .filter(|r| Facts::from_json(&r.config).is_ok())
            .take(512)
            .map(|r| r.config.clone())
            .collect(),
        Err(_) => attn_policy::facts::presets::PRESETS
            .iter()
            .map(|p| (p.config)())
            .collect(),
    }
}

fn inputs() -> Vec<Facts> {
    let corpus =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpora/te-2.20.2-corpus-a.jsonl.gz");
    if let Ok(recs) = attn_policy::read_corpus(&corpus) {
        let facts: Vec<Facts> = recs
            .iter()
            .filter_map(|r| Facts::from_json(&r.config).ok())
            .take(512)
            .collect();
        if !facts.is_empty() {
            return facts;
        }
    }
    attn_policy::facts::presets::PRESETS
        .iter()
        .map(|p| Facts::from_json(&(p.config)()).expect("presets are valid"))
        .collect()
}

fn setup() -> (Arc<CachedPolicy>, Vec<Facts>) {
    let policy = Policy::embedded("te").expect("te pack loads");
    let facts = inputs();
    let cached = Arc::new(CachedPolicy::new(policy, 4096));
    for f in &facts {
        cached.decide(f);
    }
    (cached, facts)
}

fn bench(c: &mut Criterion) {
    let (cached, facts) = setup();
    let policy = cached.policy().clone();
    let mut g = c.benchmark_group("select");
    let mut i = 0;
    let mut d = Decision::default();
    g.bench_function("uncached_decide", |b| {
        b.iter(|| {
            i = (i + 1) % facts.len();
            policy.decide_into(black_box(&facts[i]), &mut d);
            black_box(d.selected)
        })
    });
    g.bench_function("uncached_decide_explain_json", |b| {
        b.iter(|| {
            i = (i + 1) % facts.len();
            policy.decide_into(black_box(&facts[i]), &mut d);
            black_box(Explanation::new(&policy, &facts[i], &d).to_json())
        })
    });
    g.bench_function("cached", |b| {
        b.iter(|| {
            i = (i + 1) % facts.len();
            black_box(cached.decide(black_box(&facts[i])))
        })
    });
    g.finish();
}

/// Median ns per call over `rounds` batches of `batch` calls.
fn median_ns(rounds: usize, batch: usize, mut f: impl FnMut(usize)) -> f64 {
    let mut samples: Vec<f64> = (0..rounds)
        .map(|r| {
            let t = Instant::now();
            for k in 0..batch {
                f(r * batch + k);
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Calls per second with `threads` threads sharing one cache, each deciding its own stream.
fn throughput(cached: &Arc<CachedPolicy>, facts: &[Facts], threads: usize) -> f64 {
    let per_thread = 400_000;
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            s.spawn(move || {
                let mut k = th * 97;
                for _ in 0..per_thread {
                    k = (k + 1) % facts.len();
                    black_box(cached.decide(&facts[k]));
                }
            });
        }
    });
    (threads * per_thread) as f64 / t.elapsed().as_secs_f64()
}

fn summary() {
    let (cached, facts) = setup();
    let policy = cached.policy().clone();
    let pk = cached.key();
    let n = facts.len();
    let mut d = Decision::default();
    let uncached = median_ns(200, n, |k| {
        policy.decide_into(black_box(&facts[k % n]), &mut d);
        black_box(d.selected);
    });
    let explained = median_ns(50, n, |k| {
        policy.decide_into(black_box(&facts[k % n]), &mut d);
        black_box(Explanation::new(&policy, &facts[k % n], &d).to_json());
    });
    cached.cache().reset_stats();
    let hit = median_ns(200, n, |k| {
        black_box(cached.decide(black_box(&facts[k % n])));
    });
    // The same hits for facts the cache has not seen as objects: the key is encoded and
    // hashed, then compared word by word with the stored one.
    let fresh = median_ns(200, n, |k| {
        let fk = Arc::new(FactsKey::of(black_box(&facts[k % n])));
        black_box(cached.cache().get_key(pk, &fk));
    });
    let configs = configs();
    let m = configs.len().max(1);
    let from_json = median_ns(50, m, |k| {
        let f = Facts::from_json(black_box(&configs[k % m])).unwrap();
        black_box(cached.decide(&f));
    });
    let stats = cached.cache().stats();
    let ratio = |x: f64| TE_PYTHON_US * 1e3 / x;
    println!("\n== attn-policy decision cache ({n} corpus configurations, te pack) ==");
    println!(
        "{:<52} {:>10} {:>12} {:>12}",
        "measure", "median", "vs uncached", "TE 153us /"
    );
    let row = |name: &str, ns: f64| {
        println!(
            "{name:<52} {:>7.0} ns {:>11.1}x {:>11.0}x",
            ns,
            uncached / ns,
            ratio(ns)
        );
    };
    row("uncached decide (complete decision)", uncached);
    row("uncached decide + explain/v1 JSON", explained);
    row("cached decide, hit (Facts reused: key memoised)", hit);
    row("cached lookup, hit (key encoded + hashed per call)", fresh);
    row("Facts::from_json + cached decide (hit)", from_json);
    println!(
        "cache: {} hits, {} misses, hit rate {:.3}, {} / {} entries",
        stats.hits,
        stats.misses,
        stats.hit_rate(),
        stats.len,
        stats.capacity
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("\nthroughput through one shared cache ({cores} hardware threads here):");
    let base = throughput(&cached, &facts, 1);
    let mut scaling = serde_json::Map::new();
    for threads in [1, 2, 4, 8, 16] {
        let t = if threads == 1 {
            base
        } else {
            throughput(&cached, &facts, threads)
        };
        scaling.insert(
            threads.to_string(),
            serde_json::json!(format!("{:.2} M/s", t / 1e6)),
        );
        println!(
            "  {threads:>2} threads: {:>8.2} M decisions/s  ({:.2}x of 1 thread; ideal {}x)",
            t / 1e6,
            t / base,
            threads.min(cores)
        );
    }
    if let Ok(path) = std::env::var("ATTN_BENCH_JSON") {
        let j = serde_json::json!({
            "uncached_ns": uncached,
            "uncached_explain_ns": explained,
            "cached_hit_ns": hit,
            "cached_hit_fresh_key_ns": fresh,
            "from_json_cached_ns": from_json,
            "threads": scaling,
            "cores": cores,
        });
        std::fs::write(&path, j.to_string()).expect("write ATTN_BENCH_JSON");
    }
}

criterion_group!(benches, bench);

fn main() {
    // ATTN_BENCH_SUMMARY=1: only the summary table (no Criterion runs).
    if std::env::var_os("ATTN_BENCH_SUMMARY").is_none() {
        benches();
    }
    Criterion::default().configure_from_args().final_summary();
    summary();
}
