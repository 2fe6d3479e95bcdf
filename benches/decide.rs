//! Criterion benchmark of one decision with the full explanation data (every rule of every
//! backend evaluated) for the embedded `te` pack, plus pack load + type-check.
//! Run: `cargo bench --bench decide`. TE's own Python selector: ~153 µs per call.

use std::hint::black_box;

use attn_policy::Decision;
use attn_policy::facts::presets::PRESETS;
use attn_policy::{Explanation, Facts, Policy};
use criterion::{Criterion, criterion_group, criterion_main};

fn decide(c: &mut Criterion) {
    let policy = Policy::embedded("te").expect("te pack loads");
    let facts: Vec<Facts> = PRESETS
        .iter()
        .map(|p| Facts::from_json(&(p.config)()).expect("preset"))
        .collect();
    let mut d = Decision::default();
    let mut i = 0;
    c.bench_function("te/decide_into (full explanation data)", |b| {
        b.iter(|| {
            i = (i + 1) % facts.len();
            policy.decide_into(black_box(&facts[i]), &mut d);
            black_box(&d);
        })
    });
    c.bench_function("te/decide + explain JSON", |b| {
        b.iter(|| {
            i = (i + 1) % facts.len();
            let d = policy.decide(black_box(&facts[i]));
            black_box(Explanation::new(&policy, &facts[i], &d).to_json());
        })
    });
    c.bench_function("te/load and type-check", |b| {
        b.iter(|| black_box(Policy::embedded("te").expect("te pack loads")))
    });
    c.bench_function("facts/from_json (gemma4-global)", |b| {
        let json = (PRESETS[0].config)();
        b.iter(|| black_box(Facts::from_json(black_box(&json)).expect("valid")))
    });
}

criterion_group!(benches, decide);
criterion_main!(benches);
