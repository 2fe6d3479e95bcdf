//! What the GPU test files share: a fresh seed per run, and the case table run on a few
//! threads (the CPU float64 reference dominates a case's time).
// Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A seed from the clock, printed so a failing run can be repeated.
pub fn fresh_seed() -> u64 {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    println!("seed {s}");
    s
}

/// Runs `case(i, &cases[i])` for every case on up to 8 threads; each returns its table line and
/// whether it passed. The rows come back in case order: `(i, line, passed)`.
pub fn in_parallel<T: Sync>(
    cases: &[T],
    case: impl Fn(usize, &T) -> (String, bool) + Sync,
) -> Vec<(usize, String, bool)> {
    let rows = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = cases.get(i) else { break };
                    let (line, passed) = case(i, c);
                    rows.lock().unwrap().push((i, line, passed));
                }
            });
        }
    });
    let mut rows: Vec<(usize, String, bool)> = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.0);
    rows
}
