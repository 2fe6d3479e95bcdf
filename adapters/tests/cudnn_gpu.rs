//! GPU tests of the `cudnn` executor: numerics against the float64 reference (FlashAttention
//! criterion), determinism, stream safety, refusals. Each test prints a skip reason and returns
//! when there is no GPU or no libcudnn; on the H200 they run for real.
#![cfg(feature = "cudnn")]

mod common;

use std::sync::Arc;

use attn_policy_adapters::cudnn::{CudnnError, CudnnExecutor, Direction, IoPtrs, ProbeAnswer};
use attn_policy_adapters::trial::{
    RandomInputs, RunOptions, VerifyMode, random_inputs, run_on, verify,
};
use attn_policy_adapters::{
    AttentionProblem, BackwardInputs, BackwardOutput, DType, DiagonalAlignment, ExecStats,
    Executor, ForwardInputs, HostTensor, LayoutKind, MaskSpec, SeqLens, SeqPacking, Strides,
    run_backward, run_forward,
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

// ---------------------------------------------------------------------------------------------
// Per-sequence lengths: padded right, padded left, packed THD (issue 33)
// ---------------------------------------------------------------------------------------------

/// The executor for the varlen tests: cuDNN serves padded and packed batches unless the process
/// sets `ATTN_POLICY_CUDNN_VARLEN=0`. Switched off, the executor must refuse them, naming the
/// variable (asserted here), and the test stops.
fn varlen_executor() -> Option<Arc<CudnnExecutor>> {
    let ex = executor()?;
    if attn_policy_adapters::cudnn::varlen_enabled() {
        return Some(ex);
    }
    let p = AttentionProblem::new(2, 4, 4, 64, 64, 64, 64, DType::BF16).with_seqlens(
        SeqLens::padded(SeqPacking::PaddedRight, vec![10, 64], vec![10, 64]),
        LayoutKind::Bshd,
    );
    let reason = ex
        .check(&p)
        .expect_err("varlen refused where switched off")
        .reason;
    assert!(
        reason.contains(attn_policy_adapters::cudnn::VARLEN_ENV),
        "{reason}"
    );
    println!(
        "skipped: {}=0 switches the cuDNN varlen path off (refused: {reason})",
        attn_policy_adapters::cudnn::VARLEN_ENV
    );
    None
}

/// A 16-bit NaN in both bf16 and fp16: what output buffers hold before a call, so an element
/// the executor leaves unwritten shows up.
const NAN16: u16 = 0xFFFF;

/// One varlen case: the problem and a label for the table.
struct VarlenCase {
    label: String,
    p: AttentionProblem,
    layout: LayoutKind,
}

/// The case table: every packing, with GQA/MQA/MHA, causal (both diagonals), windows, bf16 and
/// fp16, head dims 64 and 128, mixed lengths with a length-1 and a full-length sequence, and
/// several layouts.
fn varlen_cases() -> Vec<VarlenCase> {
    let masks: [(&str, MaskSpec, bool); 5] = [
        ("none", MaskSpec::NONE, true),
        ("causal_tl", MaskSpec::CAUSAL_TOP_LEFT, true),
        ("causal_br", MaskSpec::CAUSAL_BOTTOM_RIGHT, false),
        (
            "win(24,0,br)",
            MaskSpec::window(24, 0, DiagonalAlignment::BottomRight),
            false,
        ),
        (
            "win(16,8,tl)",
            MaskSpec::window(16, 8, DiagonalAlignment::TopLeft),
            false,
        ),
    ];
    // (s_q, s_kv, q lengths, kv lengths): the first set has sequences with more queries than
    // keys (only masks that leave no row empty then), the second keeps q <= kv per sequence
    let any = (96usize, 112usize, vec![1, 96, 37, 60], vec![1, 112, 20, 90]);
    let le = (96usize, 128usize, vec![1, 96, 37, 64], vec![1, 128, 53, 64]);
    let mut out = Vec::new();
    let mut i = 0usize;
    for packing in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ] {
        for (mname, mask, q_gt_kv_ok) in masks {
            for dtype in [DType::BF16, DType::F16] {
                i += 1;
                let (sq, skv, lq, lkv) = if q_gt_kv_ok { any.clone() } else { le.clone() };
                let (hq, hk) = [(4, 4), (4, 2), (4, 1)][i % 3];
                let d = if i.is_multiple_of(2) { 64 } else { 128 };
                let layout = match packing {
                    SeqPacking::Packed => [LayoutKind::Bshd, LayoutKind::Bhsd][i % 2],
                    _ => [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd][i % 3],
                };
                let mut p = AttentionProblem::new(4, hq, hk, sq, skv, d, d, dtype)
                    .with_mask(mask)
                    .with_seqlens(SeqLens::padded(packing, lq, lkv), layout);
                p.deterministic = i.is_multiple_of(4);
                out.push(VarlenCase {
                    label: format!(
                        "{:<13} {:<13} {:<4} d{d:<3} {hq}/{hk} {:<4}{}",
                        packing.describe(),
                        mname,
                        dtype.rule_name(),
                        layout.rule_name(),
                        if p.deterministic { " det" } else { "" }
                    ),
                    p,
                    layout,
                });
            }
        }
    }
    out
}

/// Whether physical row `row` of tensor batch `bd` (query rows when `q`, else key rows)
/// belongs to a sequence.
fn row_is_valid(p: &AttentionProblem, bd: usize, row: usize, q: bool) -> bool {
    (0..p.batch).any(|b| {
        let (qr, kr) = p.seq_rows(b);
        let r = if q { qr } else { kr };
        r.batch == bd && row >= r.start && row < r.start + r.len
    })
}

/// Every (batch, head, row) of a tensor, valid or not: `(offset of the row, is valid)`.
fn rows_of(p: &AttentionProblem, st: &Strides, heads: usize, q: bool) -> Vec<(usize, bool)> {
    let rows = if q { p.rows_q() } else { p.rows_kv() };
    let mut out = Vec::new();
    for bd in 0..p.batch_dim() {
        for h in 0..heads {
            for r in 0..rows {
                out.push((st.offset(bd, h, r, 0), row_is_valid(p, bd, r, q)));
            }
        }
    }
    out
}

/// Overwrites the padding rows of a 16-bit tensor with NaN (inputs an executor must ignore).
fn nan_padding(
    p: &AttentionProblem,
    t: &mut HostTensor,
    st: &Strides,
    heads: usize,
    d: usize,
    q: bool,
) {
    for (o, valid) in rows_of(p, st, heads, q) {
        if !valid {
            t.data[o..o + d].fill(NAN16);
        }
    }
}

/// What the explicit padding checks found (empty when all hold).
fn padding_violations(
    p: &AttentionProblem,
    o: &HostTensor,
    lse: &[f32],
    bwd: &BackwardOutput,
) -> Vec<String> {
    let mut bad = Vec::new();
    let l = &p.layout;
    let mut check = |name: &str, t: &HostTensor, st: &Strides, heads: usize, d: usize, q: bool| {
        let (mut nonzero, mut nan) = (0usize, 0usize);
        for (off, valid) in rows_of(p, st, heads, q) {
            for &x in &t.data[off..off + d] {
                let v = t.dtype.from_bits(x);
                if v.is_nan() {
                    nan += 1;
                } else if !valid && v != 0.0 {
                    nonzero += 1;
                }
            }
        }
        if nonzero > 0 {
            bad.push(format!(
                "{name}: {nonzero} nonzero elements in padding rows"
            ));
        }
        if nan > 0 {
            bad.push(format!("{name}: {nan} NaN elements"));
        }
    };
    check("O", o, &l.o, p.heads_q, p.head_dim_v, true);
    check("dQ", &bwd.dq, &l.q, p.heads_q, p.head_dim_qk, true);
    check("dK", &bwd.dk, &l.k, p.heads_kv, p.head_dim_qk, false);
    check("dV", &bwd.dv, &l.v, p.heads_kv, p.head_dim_v, false);
    let (mut not_inf, mut nan) = (0usize, 0usize);
    for bd in 0..p.batch_dim() {
        for h in 0..p.heads_q {
            for r in 0..p.rows_q() {
                let x = lse[p.lse_index(bd, h, r)];
                if x.is_nan() {
                    nan += 1;
                } else if !row_is_valid(p, bd, r, true) && x != f32::NEG_INFINITY {
                    not_inf += 1;
                }
            }
        }
    }
    if not_inf > 0 {
        bad.push(format!("LSE: {not_inf} padding rows not -inf"));
    }
    if nan > 0 {
        bad.push(format!("LSE: {nan} NaN"));
    }
    bad
}

/// Forward then backward through the device path on a stream of its own, every output buffer
/// filled with NaN beforehand; returns (O, LSE, backward outputs).
fn run_device_varlen(
    ex: &Arc<CudnnExecutor>,
    p: &AttentionProblem,
    inp: &RandomInputs,
    nan_input_padding: bool,
) -> Result<(HostTensor, Vec<f32>, BackwardOutput), String> {
    let s = ex.context().new_stream().map_err(|e| format!("{e:?}"))?;
    let e = |x: cudarc::driver::DriverError| format!("{x:?}");
    let (mut q, mut k, mut v, mut d_o) =
        (inp.q.clone(), inp.k.clone(), inp.v.clone(), inp.d_o.clone());
    let l = &p.layout;
    if nan_input_padding {
        nan_padding(p, &mut q, &l.q, p.heads_q, p.head_dim_qk, true);
        nan_padding(p, &mut k, &l.k, p.heads_kv, p.head_dim_qk, false);
        nan_padding(p, &mut v, &l.v, p.heads_kv, p.head_dim_v, false);
        nan_padding(p, &mut d_o, &l.o, p.heads_q, p.head_dim_v, true);
    }
    let dq_ = s.clone_htod(&q.data[..p.q_span()]).map_err(e)?;
    let dk_ = s.clone_htod(&k.data[..p.k_span()]).map_err(e)?;
    let dv_ = s.clone_htod(&v.data[..p.v_span()]).map_err(e)?;
    let ddo = s.clone_htod(&d_o.data[..p.o_span()]).map_err(e)?;
    let mut o = s.clone_htod(&vec![NAN16; p.o_span()]).map_err(e)?;
    let mut lse = s.clone_htod(&vec![f32::NAN; p.lse_len()]).map_err(e)?;
    let mut gq = s.clone_htod(&vec![NAN16; p.q_span()]).map_err(e)?;
    let mut gk = s.clone_htod(&vec![NAN16; p.k_span()]).map_err(e)?;
    let mut gv = s.clone_htod(&vec![NAN16; p.v_span()]).map_err(e)?;
    {
        let (qp, _a) = dq_.device_ptr(&s);
        let (kp, _b) = dk_.device_ptr(&s);
        let (vp, _c) = dv_.device_ptr(&s);
        let (op, _d) = o.device_ptr_mut(&s);
        let (lp, _e) = lse.device_ptr_mut(&s);
        let io = IoPtrs {
            q: qp,
            k: kp,
            v: vp,
            o: op,
            lse: lp,
            ..Default::default()
        };
        // SAFETY: live buffers of the problem's spans on this device, kept until the copies below.
        unsafe { ex.enqueue(p, Direction::Forward, &io, &s) }
            .map_err(|e| format!("forward: {e}"))?;
    }
    let o_host = s.clone_dtoh(&o).map_err(e)?;
    if nan_input_padding {
        // the backward's O input must not be read in padding rows either
        let mut t = HostTensor {
            dtype: p.dtype,
            data: o_host.clone(),
        };
        nan_padding(p, &mut t, &l.o, p.heads_q, p.head_dim_v, true);
        let o_nan = s.clone_htod(&t.data).map_err(e)?;
        s.memcpy_dtod(&o_nan, &mut o).map_err(e)?;
    }
    {
        let (qp, _a) = dq_.device_ptr(&s);
        let (kp, _b) = dk_.device_ptr(&s);
        let (vp, _c) = dv_.device_ptr(&s);
        let (op, _d) = o.device_ptr(&s);
        let (lp, _e) = lse.device_ptr(&s);
        let (dop, _f) = ddo.device_ptr(&s);
        let (gqp, _g) = gq.device_ptr_mut(&s);
        let (gkp, _h) = gk.device_ptr_mut(&s);
        let (gvp, _i) = gv.device_ptr_mut(&s);
        let io = IoPtrs {
            q: qp,
            k: kp,
            v: vp,
            o: op,
            lse: lp,
            d_o: dop,
            dq: gqp,
            dk: gkp,
            dv: gvp,
        };
        // SAFETY: as above.
        unsafe { ex.enqueue(p, Direction::Backward, &io, &s) }
            .map_err(|e| format!("backward: {e}"))?;
    }
    let lse_host = s.clone_dtoh(&lse).map_err(e)?;
    let t = |d: Vec<u16>| HostTensor {
        dtype: p.dtype,
        data: d,
    };
    let bwd = BackwardOutput {
        dq: t(s.clone_dtoh(&gq).map_err(e)?),
        dk: t(s.clone_dtoh(&gk).map_err(e)?),
        dv: t(s.clone_dtoh(&gv).map_err(e)?),
        d_sink: Vec::new(),
        stats: ExecStats::default(),
    };
    s.synchronize().map_err(e)?;
    Ok((t(o_host), lse_host, bwd))
}

/// Runs the varlen table: FlashAttention criterion against float64 (every element, padding
/// rows included), plus exact padding checks (O = dQ = 0 in padding rows, dK = dV = 0 for
/// padding keys, LSE = -inf in padding rows, no NaN anywhere; every output buffer starts as
/// NaN, so an unwritten element fails).
fn varlen_table(nan_input_padding: bool) {
    let Some(ex) = varlen_executor() else { return };
    let seed = common::fresh_seed();
    let cases = varlen_cases();
    let rows = common::in_parallel(&cases, |i, c| {
        let p = &c.p;
        if let Err(u) = ex.check(p) {
            return (format!("{:>2} {}: REFUSED {}", i, c.label, u.reason), false);
        }
        let inp = random_inputs(p, seed.wrapping_add(i as u64));
        let (o, lse, bwd) = match run_device_varlen(&ex, p, &inp, nan_input_padding) {
            Ok(x) => x,
            Err(e) => return (format!("{:>2} {}: ERROR {e}", i, c.label), false),
        };
        let v = verify(p, &inp, &o, &lse, Some(&bwd));
        let bad = padding_violations(p, &o, &lse, &bwd);
        let ratio = |k: usize| v.checks[k].err / v.checks[k].naive_err.max(1e-12);
        let engines = match (
            ex.plan_info(p, Direction::Forward),
            ex.plan_info(p, Direction::Backward),
        ) {
            (Ok((_, f)), Ok((_, b))) => format!("{} / {}", f.tag, b.tag),
            (f, b) => format!("{:?} / {:?}", f.err(), b.err()),
        };
        let passed = v.passed && bad.is_empty();
        (
            format!(
                "{:>2} {} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>8.1e} | {} {}{}",
                i,
                c.label,
                ratio(0),
                ratio(1),
                ratio(2),
                ratio(3),
                v.lse_rel_err,
                engines,
                if passed { "PASS" } else { "FAIL" },
                if bad.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", bad.join("; "))
                }
            ),
            passed,
        )
    });
    println!(
        "(columns: err(cudnn, fp64) / err(naive same-dtype, fp64) for o dq dk dv, pass needs <= 2; LSE rel err){}",
        if nan_input_padding {
            "; input padding rows are NaN"
        } else {
            ""
        }
    );
    let mut failed = 0;
    for (_, line, ok) in &rows {
        println!("{line}");
        failed += usize::from(!ok);
    }
    assert_eq!(failed, 0, "{failed} of {} varlen cases failed", rows.len());
}

/// The varlen table over many seeds (`ATTN_POLICY_SEEDS`, default 8), each padded case beside
/// its dense twin (the same problem without sequence lengths): the worst ratio per output and
/// the misses per case, so a miss that one seed shows is told apart from a property of a
/// combination (and of varlen from one of cuDNN's backward as a whole).
#[test]
fn varlen_criterion_over_seeds() {
    let Some(ex) = varlen_executor() else { return };
    let seeds: u64 = std::env::var("ATTN_POLICY_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let base = common::fresh_seed();
    let mut jobs = Vec::new();
    for (i, c) in varlen_cases().into_iter().enumerate() {
        if c.p.seqlens.as_ref().map(|s| s.packing) != Some(SeqPacking::Packed) {
            let dense = AttentionProblem {
                seqlens: None,
                ..c.p.clone()
            }
            .with_layout(c.layout);
            jobs.push((format!("{i:>2}d {}", c.label), dense));
        }
        jobs.push((format!("{i:>2}  {}", c.label), c.p));
    }
    let rows = common::in_parallel(&jobs, |j, (label, p)| {
        if let Err(u) = ex.check(p) {
            return (format!("{label}: REFUSED {}", u.reason), false);
        }
        let mut worst = [0f64; 4];
        let mut misses = 0;
        for s in 0..seeds {
            let inp = random_inputs(p, base.wrapping_add(1000 * j as u64 + s));
            let (o, lse, bwd) = match run_device_varlen(&ex, p, &inp, false) {
                Ok(x) => x,
                Err(e) => return (format!("{label}: ERROR {e}"), false),
            };
            let v = verify(p, &inp, &o, &lse, Some(&bwd));
            for (k, w) in worst.iter_mut().enumerate() {
                *w = w.max(v.checks[k].err / v.checks[k].naive_err.max(1e-12));
            }
            misses += usize::from(!v.passed || !padding_violations(p, &o, &lse, &bwd).is_empty());
        }
        (
            format!(
                "{label} | {:>6.2} {:>6.2} {:>6.2} {:>6.2} | misses {misses}/{seeds}",
                worst[0], worst[1], worst[2], worst[3]
            ),
            misses == 0,
        )
    });
    println!(
        "(worst over {seeds} seeds of err(cudnn, fp64) / err(naive, fp64) for o dq dk dv; 'd' = dense twin)"
    );
    let mut failed = 0;
    for (_, line, ok) in &rows {
        println!("{line}");
        failed += usize::from(!ok);
    }
    assert_eq!(
        failed,
        0,
        "{failed} of {} cases missed on some seed",
        rows.len()
    );
}

/// Padded right, padded left and packed THD, forward and backward, against float64.
#[test]
fn varlen_padded_and_packed_forward_backward_against_float64() {
    varlen_table(false);
}

/// The same table with NaN in every padding row of Q, K, V, O and dO: nothing of a padding
/// row may reach a valid output (the executor must never read them).
#[test]
fn varlen_ignores_what_padding_rows_hold() {
    varlen_table(true);
}

/// The same sequences padded right, padded left and packed give the same valid rows (bitwise
/// equality is not promised; the FlashAttention criterion covers each), and share one plan per
/// packing whatever the lengths.
#[test]
fn varlen_plans_are_reused_across_lengths() {
    let Some(ex) = varlen_executor() else { return };
    let base = AttentionProblem::new(3, 8, 2, 128, 128, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    for packing in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ] {
        let a = base.clone().with_seqlens(
            SeqLens::padded(packing, vec![5, 128, 77], vec![9, 128, 100]),
            LayoutKind::Bshd,
        );
        let b = base.clone().with_seqlens(
            SeqLens::padded(packing, vec![128, 1, 30], vec![128, 64, 31]),
            LayoutKind::Bshd,
        );
        ex.plan_info(&a, Direction::Forward).expect("plan a");
        let before = ex.cache_stats();
        ex.plan_info(&b, Direction::Forward).expect("plan b");
        let after = ex.cache_stats();
        println!("{}: cache {before:?} -> {after:?}", packing.describe());
        // same longest lengths and strides: the plan is found again (lengths are data)
        assert_eq!(after.hits, before.hits + 1, "{packing:?}");
        assert_eq!(after.entries, before.entries, "{packing:?}");
    }
}

/// What the cuDNN executor still refuses with per-sequence lengths, typed.
#[test]
fn varlen_refusals_are_typed() {
    let Some(ex) = varlen_executor() else { return };
    let p = AttentionProblem::new(2, 4, 4, 64, 64, 64, 64, DType::BF16).with_seqlens(
        SeqLens::padded(SeqPacking::PaddedRight, vec![10, 64], vec![10, 64]),
        LayoutKind::Bshd,
    );
    assert!(ex.check(&p).is_ok());
    let mut capped = p.clone();
    capped.softcap = Some(30.0);
    println!("softcap: {}", ex.check(&capped).unwrap_err().reason);
    let mut sink = p.clone();
    sink.softmax = attn_policy_adapters::SoftmaxKind::OffByOne;
    println!("sink: {}", ex.check(&sink).unwrap_err().reason);
    let empty = p.clone().with_seqlens(
        SeqLens::padded(SeqPacking::PaddedRight, vec![0, 64], vec![10, 64]),
        LayoutKind::Bshd,
    );
    println!("empty sequence: {}", ex.check(&empty).unwrap_err().reason);
}

/// The checks of the varlen table, on the CPU: the float64 reference executor (which keeps the
/// padding conventions) passes them for every case, the cuDNN gate admits every case, and a
/// planted padding error is caught. Runs without a GPU.
#[test]
fn varlen_checks_accept_the_reference_and_catch_a_planted_error() {
    let r = attn_policy_adapters::reference::Reference;
    for (i, c) in varlen_cases().iter().enumerate() {
        let p = &c.p;
        attn_policy_adapters::cudnn::check_with(p, None, true)
            .unwrap_or_else(|u| panic!("case {i} {}: refused: {}", c.label, u.reason));
        // the float64 reference is slow in debug builds: a third of the table, every packing
        if !i.is_multiple_of(3) {
            continue;
        }
        let inp = random_inputs(p, 77 + i as u64);
        let fwd = run_forward(
            &r,
            p,
            &ForwardInputs {
                q: &inp.q,
                k: &inp.k,
                v: &inp.v,
                sink: None,
            },
        )
        .expect("reference forward");
        let bwd = run_backward(
            &r,
            p,
            &BackwardInputs {
                q: &inp.q,
                k: &inp.k,
                v: &inp.v,
                o: &fwd.o,
                d_o: &inp.d_o,
                lse: &fwd.lse,
                sink: None,
            },
        )
        .expect("reference backward");
        let bad = padding_violations(p, &fwd.o, &fwd.lse, &bwd);
        assert!(bad.is_empty(), "case {i} {}: {bad:?}", c.label);
        assert!(
            verify(p, &inp, &fwd.o, &fwd.lse, Some(&bwd)).passed,
            "case {i}"
        );
        if p.seqlens.as_ref().unwrap().packing == SeqPacking::Packed {
            continue;
        }
        // a padding row of dK left nonzero, and a padding LSE left finite, are caught
        let (off, _) = rows_of(p, &p.layout.k, p.heads_kv, false)
            .into_iter()
            .find(|(_, valid)| !valid)
            .expect("a padded case has padding keys");
        let mut planted = bwd.clone();
        planted.dk.data[off] = p.dtype.to_bits(1.0);
        let mut lse = fwd.lse.clone();
        let row = (0..p.rows_q())
            .find(|&r| !row_is_valid(p, 0, r, true))
            .expect("padding query row");
        lse[p.lse_index(0, 0, row)] = 0.5;
        let bad = padding_violations(p, &fwd.o, &lse, &planted);
        assert_eq!(bad.len(), 2, "case {i}: {bad:?}");
    }
}

/// The host path and the trial runner (`run_on`: plan, forward, backward, verification) with
/// per-sequence lengths, one case per packing.
#[test]
fn varlen_through_the_trial_runner() {
    let Some(ex) = varlen_executor() else { return };
    let seed = common::fresh_seed();
    let opts = RunOptions {
        backward: true,
        verify: VerifyMode::Always,
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for (i, packing) in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ]
    .into_iter()
    .enumerate()
    {
        let p = AttentionProblem::new(3, 8, 2, 160, 160, 128, 128, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
            .with_seqlens(
                SeqLens::padded(packing, vec![160, 1, 77], vec![160, 33, 120]),
                LayoutKind::Bshd,
            );
        match run_on(&ex, &p, seed.wrapping_add(i as u64), &opts) {
            Ok(rep) => {
                let v = rep.verification.expect("verification requested");
                println!("{p}: {}", if v.passed { "PASS" } else { "FAIL" });
                if !v.passed {
                    failures.push(format!("{p}: {v:?}"));
                }
            }
            Err(e) => failures.push(format!("{p}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
