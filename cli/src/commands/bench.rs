//! `attn-policy bench`: median nanoseconds per decision, uncached, with the full explanation
//! data (every rule of every backend evaluated). Criterion benches (benches/decide.rs) give the
//! same figure with confidence intervals; this command lets anyone reproduce it in one line.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use super::args::PackArgs;
use super::progress::Progress;
use attn_policy::Facts;
use attn_policy::facts::Value;
use attn_policy::facts::presets;
use attn_policy::{Decision, Policy};

#[derive(Args, Debug)]
#[command(after_help = concat!("\
Decides every input with the full explanation data (every rule of every backend evaluated, no
cache), in batches of 64, and prints the median and p99 of the batch medians; with --corpus also
the figure with each batch's facts warm in cache. Records that are input errors are not timed.
Criterion benches (benches/decide.rs) give the same figure with confidence intervals.

Examples:
  attn-policy bench                        # the presets of the pack's family
  attn-policy bench --corpus tests/corpora/te-2.20.2-corpus-a.jsonl.gz
  attn-policy bench --pack torch --corpus tests/corpora/torch-2.11-sdpa-corpus-a.jsonl.gz --json

", crate::exit_codes!()))]
pub struct BenchArgs {
    #[command(flatten)]
    pub pack: PackArgs,
    /// Decide every record of this corpus (.jsonl or .jsonl.gz) instead of the presets.
    #[arg(long, value_name = "FILE")]
    pub corpus: Option<PathBuf>,
    /// Passes over the inputs (at least 1).
    #[arg(long, default_value_t = 20,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub passes: usize,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchArgs) -> i32 {
    let t0 = Instant::now();
    let policy = match a.pack.load(false) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let progress = Progress::start(match &a.corpus {
        Some(p) => format!("bench: reading {}", p.display()),
        None => "bench: reading the presets".to_string(),
    });
    let (facts, input_errors) = match inputs(&policy, a.corpus.as_deref()) {
        Ok((facts, _)) if facts.is_empty() => return progress.fail("no inputs to decide"),
        Ok(read) => read,
        Err(e) => return progress.fail(e),
    };
    progress.stage(format!(
        "bench: timing {} decisions x {} passes",
        facts.len(),
        a.passes
    ));
    let mut d = Decision::default();
    // Warm up, then time batches so the clock's resolution does not dominate.
    for f in &facts {
        policy.decide_into(f, &mut d);
    }
    let batch = 64.min(facts.len());
    // Streamed: inputs come from memory as they are (a large corpus does not fit in cache).
    // Warm: each batch's facts are read once before timing, as they are in a framework that
    // has just built them; the decision itself is not run ahead, so nothing else is warmed.
    let mut streamed = Vec::new();
    let mut warm = Vec::new();
    for _ in 0..a.passes {
        for chunk in facts.chunks(batch) {
            let t = Instant::now();
            for f in chunk {
                policy.decide_into(black_box(f), &mut d);
                black_box(&d);
            }
            streamed.push(t.elapsed().as_nanos() as f64 / chunk.len() as f64);
        }
        if a.corpus.is_some() {
            for chunk in facts.chunks(batch) {
                for f in chunk {
                    black_box(f.values().iter().filter(|v| **v == Value::Null).count());
                }
                let t = Instant::now();
                for f in chunk {
                    policy.decide_into(black_box(f), &mut d);
                    black_box(&d);
                }
                warm.push(t.elapsed().as_nanos() as f64 / chunk.len() as f64);
            }
        }
    }
    progress.finish();
    let (median, p99) = median_p99(&mut streamed);
    let te_us = 153.0;
    let warm_figures = (!warm.is_empty()).then(|| median_p99(&mut warm));
    if a.json {
        let doc = serde_json::json!({
            "pack": policy.name,
            "rules": policy.rules.len(),
            "backends": policy.backends.len(),
            "load_ms": load_ms,
            "inputs": facts.len(),
            "input_errors": input_errors,
            "passes": a.passes,
            "median_ns": median,
            "p99_ns": p99,
            "warm_median_ns": warm_figures.map(|w| w.0),
            "warm_p99_ns": warm_figures.map(|w| w.1),
            "te_selector_median_us": te_us,
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
        return super::EXIT_OK;
    }
    println!(
        "pack                 {} ({} rules, {} backends)",
        policy.name,
        policy.rules.len(),
        policy.backends.len()
    );
    println!("pack load+check      {load_ms:.2} ms");
    println!(
        "inputs               {} ({} passes){}",
        facts.len(),
        a.passes,
        if input_errors > 0 {
            format!("; {input_errors} input errors not decided")
        } else {
            String::new()
        }
    );
    println!("median per decision  {median:.0} ns (batch medians; p99 {p99:.0} ns)");
    if let Some((w, wp99)) = warm_figures {
        println!("  facts warm in cache {w:.0} ns (p99 {wp99:.0} ns; streamed above)");
    }
    // The measured TE selector is TransformerEngine's: no figure to compare a torch pack with.
    if policy.schema.family == "te" {
        println!(
            "vs TE selector       ~{te_us} us median per call (tests/corpora/README.md): {:.0}x \
             faster",
            te_us * 1e3 / median
        );
    }
    0
}

/// The inputs to time and the number of records that are input errors (structurally invalid:
/// never decided, so not timed): a corpus's records read for the pack's family (a torch record
/// holds its device too; facts of another family would be decided against the wrong schema),
/// or the family's presets (a te preset means nothing to the torch pack).
fn inputs(policy: &Policy, corpus: Option<&Path>) -> Result<(Vec<Facts>, usize), String> {
    let Some(path) = corpus else {
        let presets = presets::of_family(policy.schema.family)
            .map(|p| {
                policy
                    .schema
                    .read(&(p.config)())
                    .expect("presets are valid")
            })
            .collect();
        return Ok((presets, 0));
    };
    let records = attn_policy::read_corpus(path).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(records.len());
    let mut errors = Vec::new();
    for r in &records {
        match attn_policy::conformance::read_record(policy, r) {
            Ok(mut f) => {
                f.set_all_probes(true);
                out.push(f);
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.first() {
        Some(e) if out.is_empty() => Err(format!(
            "no inputs to decide: {}",
            super::conformance::no_valid_record(policy, errors.len(), e)
        )),
        _ => Ok((out, errors.len())),
    }
}

/// Median and 99th percentile of batch medians.
fn median_p99(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    (samples[n / 2], samples[(n * 99 / 100).min(n - 1)])
}
