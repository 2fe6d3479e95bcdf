//! What `attn-policy run` calls: make random inputs for a problem, run an executor on them
//! (forward, optionally backward), time it, and verify against the float64 reference when the
//! problem is small enough.
//!
//! Verification uses the FlashAttention criterion: for O (and dQ, dK, dV), the max-abs error of
//! the executor against float64 must be at most twice the max-abs error of the textbook attention
//! computed in the same low precision (plus [`ABS_FLOOR`]); LSE must match float64 to
//! [`LSE_REL_TOL`] relative (denominator `max(|ref|, 1)`; `-inf` rows must agree exactly).

use std::sync::Arc;

use crate::executor::{
    BackwardInputs, DeviceKind, Direction, ExecError, Executor, ForwardInputs, HostIo, HostTensor,
    Plan, validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::{AttentionProblem, DType};
use crate::reference;
use crate::registry::Registry;
use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// Absolute floor of the accuracy criterion (keeps `0 <= 2 * 0` cases meaningful).
pub const ABS_FLOOR: f64 = 1e-6;
/// LSE relative tolerance against float64.
pub const LSE_REL_TOL: f64 = 1e-5;

/// When to verify against the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyMode {
    /// Verify when `b * h_q * s_q * s_kv <= RunOptions::verify_max_score_elements`.
    Auto,
    /// Always verify (may take long on the CPU).
    Always,
    /// Never verify.
    Never,
}

/// Options of [`run_random`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Also run the backward pass (random dO).
    pub backward: bool,
    /// Verification policy.
    pub verify: VerifyMode,
    /// Size limit for [`VerifyMode::Auto`] in score elements `b * h_q * s_q * s_kv`.
    pub verify_max_score_elements: u64,
    /// Untimed warm-up runs (GPU executors; CPU executors run once).
    pub warmup: usize,
    /// Timed runs; the median is reported (CPU executors run once).
    pub iters: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            backward: true,
            verify: VerifyMode::Auto,
            verify_max_score_elements: 1 << 24,
            warmup: 1,
            iters: 5,
        }
    }
}

/// Error of one output against float64, next to the naive same-dtype baseline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrCheck {
    /// Output name (`o`, `dq`, `dk`, `dv`, `d_sink`).
    pub name: String,
    /// max |executor - fp64|.
    pub err: f64,
    /// max |naive same-dtype - fp64|.
    pub naive_err: f64,
    /// `err <= 2 * naive_err + ABS_FLOOR`.
    pub passed: bool,
}

/// Result of verification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// Per-output checks (O, then dQ, dK, dV and a learnable sink's d_sink when the backward
    /// ran).
    pub checks: Vec<ErrCheck>,
    /// max |lse - lse_fp64| / max(|lse_fp64|, 1) over rows with finite reference LSE.
    pub lse_rel_err: f64,
    /// Rows whose reference LSE is `-inf` also have `-inf`, and `lse_rel_err <= LSE_REL_TOL`.
    pub lse_passed: bool,
    /// Every check passed.
    pub passed: bool,
}

/// What [`run_random`] reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Executor that ran.
    pub executor: String,
    /// Its device description.
    pub device: String,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Median forward compute time (ms).
    pub forward_ms: f64,
    /// Median backward compute time (ms), if the backward ran.
    pub backward_ms: Option<f64>,
    /// Peak bytes the executor allocated on its device (outputs + workspace), if known.
    pub peak_bytes: Option<u64>,
    /// Workspace bytes (largest of forward and backward).
    pub workspace_bytes: u64,
    /// Forward TFLOP/s over admitted pairs.
    pub forward_tflops: f64,
    /// Verification, if done.
    pub verification: Option<Verification>,
    /// Why verification was skipped, if it was.
    pub verification_skipped: Option<String>,
}

/// Random Q, K, V, dO (standard normal, rounded to the dtype) laid out with the problem's strides.
#[derive(Clone, Debug)]
pub struct RandomInputs {
    /// Q.
    pub q: HostTensor,
    /// K.
    pub k: HostTensor,
    /// V.
    pub v: HostTensor,
    /// dO (strides of O).
    pub d_o: HostTensor,
    /// Sink logits `[h_q]` (standard normal, fp32) of a learnable sink; `None` otherwise.
    pub sink: Option<Vec<f32>>,
}

/// Draw [`RandomInputs`] for `p` from `seed`. Padding elements between rows, and the rows of
/// padded sequences outside their lengths, are random too, so an executor that reads them is
/// caught. A learnable sink gets fresh random logits.
pub fn random_inputs(p: &AttentionProblem, seed: u64) -> RandomInputs {
    let mut rng = Rng::new(seed);
    let mut t = |n: usize| HostTensor {
        dtype: p.dtype,
        data: (0..n).map(|_| p.dtype.to_bits(rng.normal())).collect(),
    };
    let (q, k, v, d_o) = (t(p.q_span()), t(p.k_span()), t(p.v_span()), t(p.o_span()));
    // A stream of its own, so adding the sink leaves the tensors of a seed unchanged.
    let mut srng = Rng::new(seed ^ 0x5151_4b5f_6c6f_6769);
    let sink = (p.sink_len() > 0).then(|| {
        (0..p.sink_len())
            .map(|_| srng.normal() as f32)
            .collect::<Vec<f32>>()
    });
    RandomInputs { q, k, v, d_o, sink }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Max |a - b| over the elements a strided tensor `[b, h, s, d]` actually holds (NaN counts
/// as infinite).
pub(crate) fn max_abs_err(
    st: &crate::problem::Strides,
    dims: (usize, usize, usize, usize),
    got: &[f64],
    want: &[f64],
) -> f64 {
    let mut e = 0.0f64;
    for b in 0..dims.0 {
        for h in 0..dims.1 {
            for s in 0..dims.2 {
                let o = st.offset(b, h, s, 0);
                for d in 0..dims.3 {
                    let x = (got[o + d] - want[o + d]).abs();
                    e = if x.is_nan() { f64::INFINITY } else { e.max(x) };
                }
            }
        }
    }
    e
}

/// LSE's relative error against float64 and whether it passes: within [`LSE_REL_TOL`], and
/// `-inf` exactly where the reference has it.
pub(crate) fn lse_check(got: &[f32], want: &[f64]) -> (f64, bool) {
    if got.len() != want.len() {
        return (f64::INFINITY, false);
    }
    let mut err = 0.0f64;
    let mut inf_ok = true;
    for (&g, &w) in got.iter().zip(want) {
        if w == f64::NEG_INFINITY {
            inf_ok &= g == f32::NEG_INFINITY;
            continue;
        }
        let x = (g as f64 - w).abs() / w.abs().max(1.0);
        err = if x.is_nan() {
            f64::INFINITY
        } else {
            err.max(x)
        };
    }
    (err, inf_ok && err <= LSE_REL_TOL)
}

/// Run executor `name` from the built-in registry; see [`run_random_with`].
pub fn run_random(
    name: &str,
    p: &AttentionProblem,
    seed: u64,
    opts: &RunOptions,
) -> Result<RunReport, ExecError> {
    run_random_with(&Registry::builtin(), name, p, seed, opts)
}

/// Select `name` from `registry`, check the problem (a refusal is returned as
/// [`ExecError::Unsupported`], never replaced by another executor), run it on random inputs,
/// time it and verify it. A failed verification is reported in [`RunReport::verification`]
/// (`passed: false`), not as an error, so the caller can print the numbers.
pub fn run_random_with(
    registry: &Registry,
    name: &str,
    p: &AttentionProblem,
    seed: u64,
    opts: &RunOptions,
) -> Result<RunReport, ExecError> {
    p.validate().map_err(ExecError::invalid)?;
    let ex = registry.get(name)?;
    ex.check(p)?;
    run_on(ex.as_ref(), p, seed, opts)
}

/// [`run_random_with`] on an executor already in hand: checks the problem, plans it
/// ([`plan_trial`]) and runs the plans ([`run_planned`]).
pub fn run_on(
    ex: &dyn Executor,
    p: &AttentionProblem,
    seed: u64,
    opts: &RunOptions,
) -> Result<RunReport, ExecError> {
    ex.check(p)?;
    let plans = plan_trial(ex, p, opts)?;
    run_planned(ex, &plans, p, seed, opts)
}

/// The plans a trial runs: the forward, and the backward when [`RunOptions::backward`].
pub struct TrialPlans {
    /// The forward plan.
    pub forward: Arc<dyn Plan>,
    /// The backward plan, when the trial runs the backward.
    pub backward: Option<Arc<dyn Plan>>,
}

/// Plans what a trial of `p` on `ex` runs (the plan step of a chain walk: an error here moves
/// the walk on, an error from [`run_planned`] does not).
pub fn plan_trial(
    ex: &dyn Executor,
    p: &AttentionProblem,
    opts: &RunOptions,
) -> Result<TrialPlans, ExecError> {
    let forward = ex.plan(p, Direction::Forward)?;
    let backward = if opts.backward {
        Some(ex.plan(p, Direction::Backward)?)
    } else {
        None
    };
    Ok(TrialPlans { forward, backward })
}

/// Runs `plans` (made by [`plan_trial`] for `p` on `ex`) on random inputs drawn from `seed`,
/// times them and verifies them against the float64 reference.
pub fn run_planned(
    ex: &dyn Executor,
    plans: &TrialPlans,
    p: &AttentionProblem,
    seed: u64,
    opts: &RunOptions,
) -> Result<RunReport, ExecError> {
    if !p.dtype.is_16bit() {
        return Err(ExecError::invalid(format!(
            "run draws fp16/bf16 host tensors; {} problems run through reference::forward_strided",
            p.dtype
        )));
    }
    let inputs = random_inputs(p, seed);
    let cpu = ex.manifest().device == DeviceKind::Cpu;
    let (warmup, iters) = if cpu {
        (0, 1)
    } else {
        (opts.warmup, opts.iters.max(1))
    };
    let fin = ForwardInputs {
        q: &inputs.q,
        k: &inputs.k,
        v: &inputs.v,
        sink: inputs.sink.as_deref(),
    };
    validate_forward_inputs(p, &fin)?;
    let forward = || plans.forward.run_host(HostIo::Forward(fin))?.into_forward();
    for _ in 0..warmup {
        forward()?;
    }
    let mut times = Vec::new();
    let mut fwd = None;
    for _ in 0..iters {
        let out = forward()?;
        times.push(out.stats.compute_ms);
        fwd = Some(out);
    }
    let fwd = fwd.ok_or_else(|| ExecError::invalid("no forward run"))?;
    let forward_ms = median(times);
    let mut peak = fwd.stats.peak_bytes;
    let mut workspace = fwd.stats.workspace_bytes;
    let mut backward_ms = None;
    let mut bwd = None;
    if let Some(bplan) = &plans.backward {
        let bin = BackwardInputs {
            q: &inputs.q,
            k: &inputs.k,
            v: &inputs.v,
            o: &fwd.o,
            d_o: &inputs.d_o,
            lse: &fwd.lse,
            sink: inputs.sink.as_deref(),
        };
        validate_backward_inputs(p, &bin)?;
        let backward = || bplan.run_host(HostIo::Backward(bin))?.into_backward();
        for _ in 0..warmup {
            backward()?;
        }
        let mut times = Vec::new();
        for _ in 0..iters {
            let out = backward()?;
            times.push(out.stats.compute_ms);
            bwd = Some(out);
        }
        backward_ms = Some(median(times));
        if let Some(b) = &bwd {
            workspace = workspace.max(b.stats.workspace_bytes);
            peak = match (peak, b.stats.peak_bytes) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    let score_elems = (p.batch * p.heads_q) as u64 * p.seqlen_q as u64 * p.seqlen_kv as u64;
    let (verification, verification_skipped) = match opts.verify {
        VerifyMode::Never => (None, Some("verification disabled".to_string())),
        VerifyMode::Auto if score_elems > opts.verify_max_score_elements => (
            None,
            Some(format!(
                "problem too large for the float64 reference ({score_elems} score elements > {})",
                opts.verify_max_score_elements
            )),
        ),
        _ => (
            Some(verify(p, &inputs, &fwd.o, &fwd.lse, bwd.as_ref())),
            None,
        ),
    };
    Ok(RunReport {
        executor: ex.name().to_string(),
        device: ex.device_description(),
        seed,
        forward_ms,
        backward_ms,
        peak_bytes: peak,
        workspace_bytes: workspace,
        forward_tflops: p.forward_flops() / (forward_ms * 1e-3) / 1e12,
        verification,
        verification_skipped,
    })
}

/// Compare outputs with the float64 reference and the naive same-dtype baseline: O, LSE and,
/// when the backward ran, dQ, dK, dV and (learnable sink) d_sink. Every element of the tensors
/// is compared, padding rows included (the reference has `O = 0`, `LSE = -inf` and zero
/// gradients there).
pub fn verify(
    p: &AttentionProblem,
    inputs: &RandomInputs,
    o: &HostTensor,
    lse: &[f32],
    bwd: Option<&crate::executor::BackwardOutput>,
) -> Verification {
    let q = reference::decode(&inputs.q);
    let k = reference::decode(&inputs.k);
    let v = reference::decode(&inputs.v);
    let sink: Option<Vec<f64>> = inputs
        .sink
        .as_ref()
        .map(|s| s.iter().map(|&x| x as f64).collect());
    let sink = sink.as_deref();
    let (o_ref, lse_ref) = reference::forward_f64_sink(p, &q, &k, &v, sink);
    let (o_naive, _) = reference::naive_forward_sink(p, &q, &k, &v, sink);
    let (b, rq, rkv) = (p.batch_dim(), p.rows_q(), p.rows_kv());
    let odims = (b, p.heads_q, rq, p.head_dim_v);
    let mut checks = vec![mk_check(
        "o",
        max_abs_err(&p.layout.o, odims, &reference::decode(o), &o_ref),
        max_abs_err(&p.layout.o, odims, &o_naive, &o_ref),
    )];
    let (lse_rel_err, lse_passed) = lse_check(lse, &lse_ref);
    if let Some(bw) = bwd {
        let d_o = reference::decode(&inputs.d_o);
        let r = reference::backward_f64_sink(p, &q, &k, &v, &d_o, sink);
        let n = reference::naive_backward_sink(p, &q, &k, &v, &d_o, sink);
        let qd = (b, p.heads_q, rq, p.head_dim_qk);
        let kd = (b, p.heads_kv, rkv, p.head_dim_qk);
        let vd = (b, p.heads_kv, rkv, p.head_dim_v);
        let got = [
            reference::decode(&bw.dq),
            reference::decode(&bw.dk),
            reference::decode(&bw.dv),
        ];
        for (name, st, dims, g, r, n) in [
            ("dq", &p.layout.q, qd, &got[0], &r.dq, &n.dq),
            ("dk", &p.layout.k, kd, &got[1], &r.dk, &n.dk),
            ("dv", &p.layout.v, vd, &got[2], &r.dv, &n.dv),
        ] {
            checks.push(mk_check(
                name,
                max_abs_err(st, dims, g, r),
                max_abs_err(st, dims, n, r),
            ));
        }
        if !r.d_sink.is_empty() {
            let got: Vec<f64> = bw.d_sink.iter().map(|&x| x as f64).collect();
            let mut c = mk_check(
                "d_sink",
                vec_abs_err(&got, &r.d_sink),
                vec_abs_err(&n.d_sink, &r.d_sink),
            );
            let floor = d_sink_rounding_floor(p, &d_o, &o_ref, &lse_ref, sink.unwrap_or(&[]));
            c.passed |= c.err <= 2.0 * c.naive_err + floor + ABS_FLOOR;
            checks.push(c);
        }
    }
    let passed = lse_passed && checks.iter().all(|c| c.passed);
    Verification {
        checks,
        lse_rel_err,
        lse_passed,
        passed,
    }
}

/// What storing O in the dtype alone can move d_sink by: d_sink sums `exp(s_h - LSE_i) D_i`
/// with `D_i = rowsum(dO_i O_i)` over every row of a head, and an executor's D is that of its
/// own rounded O, so its error is O's rounding, however the rows' errors happen to add up (the
/// naive baseline's may cancel by luck). Returns `2 u max_h sum_i exp(s_h - LSE_i) sum_d |dO
/// O|`, `u` the dtype's unit roundoff: the d_sink check's floor.
pub fn d_sink_rounding_floor(
    p: &AttentionProblem,
    d_o: &[f64],
    o_ref: &[f64],
    lse_ref: &[f64],
    sink: &[f64],
) -> f64 {
    let u = match p.dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
    };
    let mut worst = 0.0f64;
    for (h, &s_h) in sink.iter().enumerate().take(p.sink_len()) {
        let mut acc = 0.0;
        for b in 0..p.batch_dim() {
            for row in 0..p.rows_q() {
                let l = lse_ref[p.lse_index(b, h, row)];
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let at = p.layout.o.offset(b, h, row, 0);
                let dot: f64 = (at..at + p.head_dim_v)
                    .map(|i| (d_o[i] * o_ref[i]).abs())
                    .sum();
                acc += (s_h - l).exp() * dot;
            }
        }
        worst = worst.max(acc);
    }
    2.0 * u * worst
}

/// Max |a - b| of two vectors; infinite when their lengths differ (a missing output).
fn vec_abs_err(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter().zip(want).fold(0.0f64, |e, (a, b)| {
        let x = (a - b).abs();
        if x.is_nan() { f64::INFINITY } else { e.max(x) }
    })
}

fn mk_check(name: &str, err: f64, naive_err: f64) -> ErrCheck {
    ErrCheck {
        name: name.into(),
        err,
        naive_err,
        passed: err <= 2.0 * naive_err + ABS_FLOOR,
    }
}
