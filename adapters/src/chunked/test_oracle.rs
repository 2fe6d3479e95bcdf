//! The chunked tests' check of outputs against the float64 reference
//! (`reference::forward_f64_sink` / `backward_f64_sink`) and the naive same-dtype baseline
//! (`naive_forward_sink` / `naive_backward_sink`), with soft-capping, sinks and per-sequence
//! lengths: used by the CPU mock tests and the GPU tests (adapters/tests/gpu_chunked.rs). Not
//! part of the API (hidden from the docs).

use crate::executor::HostTensor;
use crate::problem::{AttentionProblem, DType, SoftmaxKind};
use crate::{reference, trial};

/// One output's check: `(name, err vs fp64, naive same-dtype err vs fp64, passed)`.
pub type OracleCheck = (&'static str, f64, f64, bool);

/// The FlashAttention criterion (`err <= 2 naive_err + u max|fp64| + 1e-6`, `u` the dtype's
/// unit roundoff) for O, dQ, dK, dV and d_sink (when `grads` is given), and LSE within 1e-5
/// relative of fp64 with `-inf` exactly where fp64 has it (padding and fully masked rows).
/// Outputs are compared over every row, padding included (zeros there). d_sink sums
/// `D = rowsum(dO O)` over many rows with O stored in the dtype, so its error is that of O's
/// rounding, whichever way the rows' errors happen to add up: its floor is
/// `2 u sum_i exp(s_h - LSE_i) sum_d |dO O|`. `sink`: the learnable logits (else ignored).
/// Returns every check and whether all passed.
pub fn oracle_verify(
    p: &AttentionProblem,
    inputs: [&HostTensor; 4],
    sink: &[f32],
    o: &HostTensor,
    lse: &[f32],
    grads: Option<(&HostTensor, &HostTensor, &HostTensor, &[f32])>,
) -> (Vec<OracleCheck>, bool) {
    let [q, k, v, d_o] = inputs.map(reference::decode);
    let sink64: Vec<f64> = sink.iter().map(|&x| x as f64).collect();
    let logits = (p.softmax == SoftmaxKind::Learnable).then_some(&sink64[..]);
    let (o_ref, lse_ref) = reference::forward_f64_sink(p, &q, &k, &v, logits);
    let (o_naive, _) = reference::naive_forward_sink(p, &q, &k, &v, logits);
    let (bd, rq, rk) = (p.batch_dim(), p.rows_q(), p.rows_kv());
    // The dtype's unit roundoff (half an ulp, relative).
    let u = if p.dtype == DType::F16 {
        2f64.powi(-11)
    } else {
        2f64.powi(-8)
    };
    // Small problems: both results end rounded to the dtype, and which way one output rounds
    // is a coin toss against the other's, so the floor admits half an ulp of the largest value.
    let max_abs = |x: &[f64]| x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let mk = |name: &'static str, err: f64, naive_err: f64, want: &[f64]| -> OracleCheck {
        (
            name,
            err,
            naive_err,
            err <= 2.0 * naive_err + u * max_abs(want) + 1e-6,
        )
    };
    let od = (bd, p.heads_q, rq, p.head_dim_v);
    let mut checks = vec![mk(
        "o",
        trial::max_abs_err(&p.layout.o, od, &reference::decode(o), &o_ref),
        trial::max_abs_err(&p.layout.o, od, &o_naive, &o_ref),
        &o_ref,
    )];
    let (lse_err, lse_ok) = trial::lse_check(lse, &lse_ref);
    checks.push(("lse", lse_err, trial::LSE_REL_TOL, lse_ok));
    if let Some((dq, dk, dv, d_sink)) = grads {
        let exact = reference::backward_f64_sink(p, &q, &k, &v, &d_o, logits);
        let naive = reference::naive_backward_sink(p, &q, &k, &v, &d_o, logits);
        let qd = (bd, p.heads_q, rq, p.head_dim_qk);
        let kd = (bd, p.heads_kv, rk, p.head_dim_qk);
        let vd = (bd, p.heads_kv, rk, p.head_dim_v);
        for (name, st, dims, got, want, nv) in [
            ("dq", &p.layout.q, qd, dq, &exact.dq, &naive.dq),
            ("dk", &p.layout.k, kd, dk, &exact.dk, &naive.dk),
            ("dv", &p.layout.v, vd, dv, &exact.dv, &naive.dv),
        ] {
            checks.push(mk(
                name,
                trial::max_abs_err(st, dims, &reference::decode(got), want),
                trial::max_abs_err(st, dims, nv, want),
                want,
            ));
        }
        let mut err = if d_sink.len() == exact.d_sink.len() {
            0.0f64
        } else {
            f64::INFINITY
        };
        let mut nerr = 0.0f64;
        for ((g, w), n) in d_sink.iter().zip(&exact.d_sink).zip(&naive.d_sink) {
            let x = (*g as f64 - w).abs();
            err = if x.is_nan() {
                f64::INFINITY
            } else {
                err.max(x)
            };
            nerr = nerr.max((n - w).abs());
        }
        let floor = trial::d_sink_rounding_floor(p, &d_o, &o_ref, &lse_ref, &sink64);
        checks.push(("d_sink", err, nerr, err <= 2.0 * nerr + floor + 1e-6));
    }
    let passed = checks.iter().all(|c| c.3);
    (checks, passed)
}
