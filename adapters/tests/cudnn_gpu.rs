//! GPU tests of the `cudnn` executor: numerics against the float64 reference (FlashAttention
//! criterion), determinism, stream safety, refusals. Each test prints a skip reason and returns
//! when there is no GPU or no libcudnn; on the H200 they run for real.
#![cfg(feature = "cudnn")]

use std::sync::Arc;

use attn_policy_adapters::cudnn::{CudnnError, CudnnExecutor, Direction, IoPtrs, ProbeAnswer};
use attn_policy_adapters::trial::{RunOptions, VerifyMode, random_inputs, run_on};
use attn_policy_adapters::{
    AttentionProblem, BackwardInputs, DType, DiagonalAlignment, Executor, ForwardInputs,
    LayoutKind, MaskSpec, run_backward, run_forward,
};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

fn executor() -> Option<Arc<CudnnExecutor>> {
    match attn_policy_adapters::cudnn::shared() {
        Ok(e) => {
            println!(
                "cudnnGetVersion() = {} ({})",
                e.version().0,
                e.device_description()
            );
            Some(e)
        }
        Err(e) => {
            println!("SKIPPED (no GPU/cuDNN here): {e}");
            None
        }
    }
}

fn mask_name(m: &MaskSpec) -> String {
    match (m.kind.rule_name(), m.window_left, m.window_right) {
        (k, -1, _) => k.to_string(),
        (k, l, r) => format!("{k}+win({l},{r},{:?})", m.alignment),
    }
}

#[test]
fn numerics_forward_backward_against_float64() {
    let Some(ex) = executor() else { return };
    let masks = [
        (MaskSpec::NONE, false),
        (MaskSpec::CAUSAL_TOP_LEFT, false),
        (MaskSpec::CAUSAL_BOTTOM_RIGHT, true),
        (
            MaskSpec {
                window_left: 48,
                ..MaskSpec::CAUSAL_TOP_LEFT
            },
            false,
        ),
        (
            MaskSpec::window(40, 8, DiagonalAlignment::BottomRight),
            true,
        ),
        (MaskSpec::window(32, -1, DiagonalAlignment::TopLeft), false),
    ];
    let layouts = [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd];
    let opts = RunOptions {
        backward: true,
        verify: VerifyMode::Always,
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    println!(
        "{:>4} {:>5} {:<34} {:>5} {:>5} {:>8} {:>4} | {:>6} {:>6} {:>6} {:>6} {:>9} | engines fwd / bwd",
        "d", "dtype", "mask", "hq/hk", "lay", "sq x skv", "det", "o", "dq", "dk", "dv", "lse_rel"
    );
    let mut failures = Vec::new();
    let mut case = 0usize;
    for d in [64usize, 128, 256] {
        for dtype in [DType::BF16, DType::F16] {
            for (mask, rect) in masks {
                case += 1;
                let (hq, hk) = if case.is_multiple_of(2) {
                    (4, 2)
                } else {
                    (4, 4)
                };
                let (sq, skv) = if rect {
                    (96, 200)
                } else if case.is_multiple_of(3) {
                    (136, 136)
                } else {
                    (120, 184)
                };
                let layout = layouts[case % 3];
                let mut p = AttentionProblem::new(2, hq, hk, sq, skv, d, d, dtype)
                    .with_mask(mask)
                    .with_layout(layout);
                p.deterministic = case.is_multiple_of(4);
                let engines = match (
                    ex.plan_info(&p, Direction::Forward),
                    ex.plan_info(&p, Direction::Backward),
                ) {
                    (Ok((_, f)), Ok((_, b))) => format!("{} / {}", f.tag, b.tag),
                    (f, b) => format!("{:?} / {:?}", f.err(), b.err()),
                };
                let r = run_on(&ex, &p, 1000 + case as u64, &opts);
                let v = match r {
                    Ok(rep) => rep.verification.expect("verification requested"),
                    Err(e) => {
                        failures.push(format!("case {case}: {e}"));
                        println!("case {case}: ERROR {e}");
                        continue;
                    }
                };
                let ratio = |i: usize| v.checks[i].err / v.checks[i].naive_err.max(1e-12);
                println!(
                    "{:>4} {:>5} {:<34} {:>5} {:>5} {:>8} {:>4} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>9.1e} | {} {}",
                    d,
                    dtype.rule_name(),
                    mask_name(&mask),
                    format!("{hq}/{hk}"),
                    layout.rule_name(),
                    format!("{sq}x{skv}"),
                    if p.deterministic { "yes" } else { "no" },
                    ratio(0),
                    ratio(1),
                    ratio(2),
                    ratio(3),
                    v.lse_rel_err,
                    engines,
                    if v.passed { "PASS" } else { "FAIL" }
                );
                if !v.passed {
                    failures.push(format!(
                        "case {case} d{d} {dtype} {}: {:?}",
                        mask_name(&mask),
                        v
                    ));
                }
            }
        }
    }
    println!("(columns o..dv: err(cudnn, fp64) / err(naive same-dtype, fp64); pass needs <= 2)");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// MLA's head dims (DeepSeek-V3: q/k 192, v 128): the graphs take V and O with their own head
/// dim. Forward and backward meet the FlashAttention criterion against float64.
#[test]
fn mla_head_dims_forward_backward_against_float64() {
    let Some(ex) = executor() else { return };
    let opts = RunOptions {
        backward: true,
        verify: VerifyMode::Always,
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for (i, (hq, hk, sq, skv, mask, dtype)) in [
        (8, 8, 128, 128, MaskSpec::CAUSAL_TOP_LEFT, DType::BF16),
        (8, 2, 96, 200, MaskSpec::CAUSAL_BOTTOM_RIGHT, DType::BF16),
        (4, 4, 136, 136, MaskSpec::NONE, DType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        let p = AttentionProblem::new(2, hq, hk, sq, skv, 192, 128, dtype).with_mask(mask);
        match run_on(&ex, &p, 2000 + i as u64, &opts) {
            Ok(rep) => {
                let v = rep.verification.expect("verification requested");
                println!(
                    "MLA case {i} ({p}): {}",
                    if v.passed { "PASS" } else { "FAIL" }
                );
                if !v.passed {
                    failures.push(format!("case {i}: {v:?}"));
                }
            }
            Err(e) => failures.push(format!("case {i} ({p}): {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn deterministic_backward_is_bitwise_reproducible() {
    let Some(ex) = executor() else { return };
    for det in [true, false] {
        let mut p = AttentionProblem::new(2, 8, 4, 512, 512, 128, 128, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
        p.deterministic = det;
        let inp = random_inputs(&p, 7);
        let fwd = run_forward(
            &ex,
            &p,
            &ForwardInputs {
                q: &inp.q,
                k: &inp.k,
                v: &inp.v,
                sink: None,
            },
        )
        .expect("forward");
        let bin = BackwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            o: &fwd.o,
            d_o: &inp.d_o,
            lse: &fwd.lse,
            sink: None,
        };
        let first = run_backward(&ex, &p, &bin).expect("backward");
        let mut identical = true;
        for _ in 0..5 {
            let again = run_backward(&ex, &p, &bin).expect("backward");
            identical &= again.dq.data == first.dq.data
                && again.dk.data == first.dk.data
                && again.dv.data == first.dv.data;
        }
        let (_, eng) = ex.plan_info(&p, Direction::Backward).expect("plan");
        println!(
            "deterministic={det}: 6 backward runs bitwise identical: {identical} (engine {})",
            eng.summary()
        );
        if det {
            assert!(
                identical,
                "the deterministic backward differed between runs"
            );
        }
    }
}

#[test]
fn forward_on_a_side_stream_is_bitwise_identical_to_the_default_stream() {
    let Some(ex) = executor() else { return };
    let p = AttentionProblem::new(2, 8, 4, 2048, 2048, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    let inp = random_inputs(&p, 11);
    let main: Arc<CudaStream> = ex.stream().clone();
    let side = ex.context().new_stream().expect("stream");
    let src_q = main.clone_htod(&inp.q.data).unwrap();
    let k = main.clone_htod(&inp.k.data).unwrap();
    let v = main.clone_htod(&inp.v.data).unwrap();
    main.synchronize().unwrap();

    // returns O after: zero O, copy Q into place, forward, all on `s`
    let run_on_stream = |s: &Arc<CudaStream>| -> Vec<u16> {
        let mut q = s.alloc_zeros::<u16>(p.q_span()).unwrap();
        let mut o = s.alloc_zeros::<u16>(p.o_span()).unwrap();
        let mut lse = s.alloc_zeros::<f32>(p.lse_len()).unwrap();
        s.memcpy_dtod(&src_q, &mut q).unwrap();
        {
            let (qp, _a) = q.device_ptr(s);
            let (kp, _b) = k.device_ptr(s);
            let (vp, _c) = v.device_ptr(s);
            let (op, _d) = o.device_ptr_mut(s);
            let (lp, _e) = lse.device_ptr_mut(s);
            let io = IoPtrs {
                q: qp,
                k: kp,
                v: vp,
                o: op,
                lse: lp,
                ..Default::default()
            };
            // SAFETY: live buffers of the problem's spans on this device, kept until the copy below.
            unsafe { ex.enqueue(&p, Direction::Forward, &io, s) }.expect("enqueue");
        }
        let out = s.clone_dtoh(&o).unwrap();
        s.synchronize().unwrap();
        out
    };
    let reference = run_on_stream(&main);
    let mut same = 0;
    for i in 0..50 {
        // alternate so the handle's bound stream changes on every call
        let s = if i % 2 == 0 { &side } else { &main };
        if run_on_stream(s) == reference {
            same += 1;
        }
    }
    println!(
        "side/default stream alternation: {same}/50 forwards bitwise identical to the default-stream result"
    );
    assert_eq!(same, 50);
}

#[test]
fn refusals_are_typed() {
    let Some(ex) = executor() else { return };
    // head_dim 512 is outside the gate (documented SM90 limit), without touching cuDNN
    let big = AttentionProblem::new(1, 2, 2, 128, 128, 512, 512, DType::BF16);
    let e = ex.check(&big).unwrap_err();
    println!("d512 gate: {}", e.reason);
    // an empty query row (bottom-right, s_q > s_kv) is refused by the gate
    let empty = AttentionProblem::new(1, 2, 2, 256, 128, 64, 64, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    assert!(ex.check(&empty).is_err());
    // the probe answers yes for a supported problem, with the engine
    let ok = AttentionProblem::new(1, 8, 4, 1024, 1024, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    match ex.probe(&ok, Direction::Backward) {
        ProbeAnswer::Yes { engine } => println!("probe bwd d128: yes, {engine}"),
        other => panic!("probe: {other:?}"),
    }
    // a deterministic backward either builds a plan without the NONDETERMINISTIC note or is a
    // typed refusal, never a silent non-deterministic plan
    let mut det = ok.clone();
    det.deterministic = true;
    match ex.plan_info(&det, Direction::Backward) {
        Ok((_, eng)) => {
            assert!(!eng.nondeterministic);
            println!("deterministic bwd plan: {}", eng.summary());
        }
        Err(e @ CudnnError::NoDeterministicPlan { .. }) => {
            println!("deterministic bwd refused: {e}")
        }
        Err(e) => panic!("unexpected: {e}"),
    }
    let stats = ex.cache_stats();
    println!("plan cache (this thread): {stats:?}");
    assert!(stats.entries > 0);
}
