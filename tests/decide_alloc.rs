//! A decision allocates nothing once its `Decision` has grown: a counting global allocator
//! watches `decide_into` for every preset of every embedded pack (its family's presets).
//! This file is its own test binary, so the allocator counts this test alone.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use attn_policy::facts;
use attn_policy::facts::presets;
use attn_policy::{Decision, Policy};

/// Counts allocations (and reallocations) while `ARMED`; frees are not counted.
struct Counting;
static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` unchanged; the counter is a relaxed atomic that
// has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: `ptr` and `layout` come from this allocator, i.e. from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` and `layout` come from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn deciding_a_preset_allocates_nothing_after_warm_up() {
    let mut checked = 0;
    for name in attn_policy::pack::embedded_pack_names() {
        let policy = Policy::embedded(name).expect("embedded pack loads");
        let family = facts::family(policy.schema.family).expect("a known family");
        let inputs: Vec<_> = presets::of_family(family.family)
            .map(|p| (p.name, family.read(&(p.config)()).expect("preset is valid")))
            .collect();
        assert!(!inputs.is_empty(), "pack `{name}` has no presets to check");
        let mut d = Decision::default();
        // Warm-up: the one Decision grows to the largest explanation of any preset.
        for (_, f) in &inputs {
            policy.decide_into(f, &mut d);
        }
        for (preset, f) in &inputs {
            ALLOCS.store(0, Ordering::Relaxed);
            ARMED.store(true, Ordering::Relaxed);
            for _ in 0..3 {
                policy.decide_into(f, &mut d);
            }
            ARMED.store(false, Ordering::Relaxed);
            let n = ALLOCS.load(Ordering::Relaxed);
            assert_eq!(
                n, 0,
                "pack `{name}`, preset `{preset}`: {n} heap allocations in 3 warm decisions"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "too few presets checked: {checked}");
}
