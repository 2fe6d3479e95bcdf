// Test-only float64 oracle of attention with soft-capping, sinks and per-sequence lengths,
// `include!`d by the chunked executor's CPU mock tests and its GPU tests (the includer brings
// `AttentionProblem`, `DType`, `HostTensor`, `SoftmaxKind` and `Strides` into scope). It follows the math
// of `AttentionProblem`'s docs literally, sequence by sequence, head by head: exact (`round =
// None`, the float64 reference) or with every stored intermediate rounded to the dtype (the
// naive same-dtype baseline of the FlashAttention criterion).

/// Outputs in the problem's strides (zeros between rows and in padding), LSE `[batch_dim, h_q,
/// rows_q]`, d_sink `[h_q]` (learnable sinks only, else empty).
#[allow(dead_code)]
pub struct OracleOut {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub d_sink: Vec<f64>,
    /// `sum_i exp(s_h - LSE_i) sum_d |dO O|` per head: what rounding O to the dtype can move
    /// d_sink by, per unit roundoff.
    pub d_sink_abs: Vec<f64>,
}

/// The sink logit of head `h`, if the softmax has one.
fn sink_of(p: &AttentionProblem, sink: &[f64], h: usize) -> Option<f64> {
    match p.softmax {
        SoftmaxKind::Vanilla => None,
        SoftmaxKind::OffByOne => Some(0.0),
        SoftmaxKind::Learnable => Some(sink[h]),
    }
}

/// Forward and backward of `p` on decoded inputs (`sink`: the learnable logits, `[h_q]`).
#[allow(clippy::too_many_arguments)]
pub fn oracle(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sink: &[f64],
    round: Option<DType>,
) -> OracleOut {
    let r = |x: f64| round.map_or(x, |d| d.round(x));
    let (dqk, dv, scale) = (p.head_dim_qk, p.head_dim_v, p.softmax_scale);
    let (lq, lk, lv, lo) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
    let mut out = OracleOut {
        o: vec![0.0; p.o_span()],
        lse: vec![f64::NEG_INFINITY; p.lse_len()],
        dq: vec![0.0; p.q_span()],
        dk: vec![0.0; p.k_span()],
        dv: vec![0.0; p.v_span()],
        d_sink: vec![0.0; p.sink_len()],
        d_sink_abs: vec![0.0; p.sink_len()],
    };
    for b in 0..p.batch {
        let (qr, kr) = p.seq_rows(b);
        let m = p.seq_mask(b);
        for h in 0..p.heads_q {
            let g = h / p.group_size();
            let s_h = sink_of(p, sink, h);
            for i in 0..qr.len {
                let row = qr.start + i;
                let (lo_k, hi_k) = m.row_range(i);
                let (lo_k, hi_k) = (lo_k.max(0) as usize, (hi_k.max(0) as usize).min(kr.len));
                if lo_k >= hi_k {
                    continue;
                }
                let qo = lq.offset(qr.batch, h, row, 0);
                let oo = lo.offset(qr.batch, h, row, 0);
                let qi = &q[qo..qo + dqk];
                let koff = |j: usize| lk.offset(kr.batch, g, kr.start + j, 0);
                let voff = |j: usize| lv.offset(kr.batch, g, kr.start + j, 0);
                // Scores: scaled, then capped (a framework stores each step).
                let mut s = Vec::with_capacity(hi_k - lo_k);
                let mut t = Vec::with_capacity(hi_k - lo_k);
                for j in lo_k..hi_k {
                    let dot: f64 = qi
                        .iter()
                        .zip(&k[koff(j)..koff(j) + dqk])
                        .map(|(a, b)| a * b)
                        .sum();
                    let x = r(r(dot) * scale);
                    match p.softcap {
                        Some(c) => {
                            let th = (x / c).tanh();
                            t.push(th);
                            s.push(r(c * th));
                        }
                        None => {
                            t.push(0.0);
                            s.push(x);
                        }
                    }
                }
                let mx = s
                    .iter()
                    .copied()
                    .chain(s_h)
                    .fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = s.iter().map(|x| (x - mx).exp()).sum::<f64>()
                    + s_h.map_or(0.0, |x| (x - mx).exp());
                let lse = mx + sum.ln();
                out.lse[p.lse_index(qr.batch, h, row)] = lse;
                let pr: Vec<f64> = s.iter().map(|x| r((x - mx).exp() / sum)).collect();
                let mut oi = vec![0.0; dv];
                for (jj, pj) in pr.iter().enumerate() {
                    let vo = voff(lo_k + jj);
                    for (a, b) in oi.iter_mut().zip(&v[vo..vo + dv]) {
                        *a += pj * b;
                    }
                }
                for (d, x) in oi.iter().enumerate() {
                    out.o[oo + d] = r(*x);
                }
                // Backward: D from this computation's O.
                let doi = &d_o[oo..oo + dv];
                let dsum: f64 = doi
                    .iter()
                    .zip(&out.o[oo..oo + dv])
                    .map(|(a, b)| a * b)
                    .sum();
                if p.softmax == SoftmaxKind::Learnable {
                    let w = (sink[h] - lse).exp();
                    out.d_sink[h] -= w * dsum;
                    let dabs: f64 = doi
                        .iter()
                        .zip(&out.o[oo..oo + dv])
                        .map(|(a, b)| (a * b).abs())
                        .sum();
                    out.d_sink_abs[h] += w * dabs;
                }
                let mut dqi = vec![0.0; dqk];
                for (jj, pj) in pr.iter().enumerate() {
                    let j = lo_k + jj;
                    let (ko, vo) = (koff(j), voff(j));
                    let dp = r(doi
                        .iter()
                        .zip(&v[vo..vo + dv])
                        .map(|(a, b)| a * b)
                        .sum::<f64>());
                    let mut ds = r(pj * (dp - dsum));
                    if p.softcap.is_some() {
                        ds = r(ds * (1.0 - t[jj] * t[jj]));
                    }
                    for (a, b) in out.dv[vo..vo + dv].iter_mut().zip(doi) {
                        *a += pj * b;
                    }
                    for (a, b) in dqi.iter_mut().zip(&k[ko..ko + dqk]) {
                        *a += ds * b;
                    }
                    for (a, b) in out.dk[ko..ko + dqk].iter_mut().zip(qi) {
                        *a += ds * b;
                    }
                }
                for (d, x) in dqi.iter().enumerate() {
                    out.dq[qo + d] = r(x * scale);
                }
            }
        }
    }
    for x in out.dk.iter_mut() {
        *x = r(*x * scale);
    }
    for x in out.dv.iter_mut() {
        *x = r(*x);
    }
    out
}

/// Max |got - want| over the elements of a strided tensor (`[batch_dim, h, rows, d]`); NaN
/// counts as infinite.
fn oracle_err(st: &Strides, dims: (usize, usize, usize, usize), got: &[f64], want: &[f64]) -> f64 {
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

/// One output's check: `(name, err vs fp64, naive same-dtype err vs fp64, passed)`.
pub type OracleCheck = (&'static str, f64, f64, bool);

/// The FlashAttention criterion (`err <= 2 naive_err + u max|fp64| + 1e-6`, `u` the dtype's
/// unit roundoff) for O, dQ, dK, dV and d_sink
/// (when `grads` is given), and LSE within 1e-5 relative of fp64 with `-inf` exactly where
/// fp64 has it (padding and fully masked rows). d_sink sums `D = rowsum(dO O)` over many
/// rows with O stored in the dtype, so its error is that of O's rounding, whichever way the
/// rows' errors happen to add up: its floor is `2 u sum_i exp(s_h - LSE_i) sum_d |dO O|`. Returns every check and whether all passed.
#[allow(clippy::too_many_arguments)]
pub fn oracle_verify(
    p: &AttentionProblem,
    inputs: [&HostTensor; 4],
    sink: &[f32],
    o: &HostTensor,
    lse: &[f32],
    grads: Option<(&HostTensor, &HostTensor, &HostTensor, &[f32])>,
) -> (Vec<OracleCheck>, bool) {
    let dec =
        |t: &HostTensor| -> Vec<f64> { t.data.iter().map(|&b| t.dtype.from_bits(b)).collect() };
    let [q, k, v, d_o] = inputs.map(dec);
    let sink: Vec<f64> = sink.iter().map(|&x| x as f64).collect();
    let exact = oracle(p, &q, &k, &v, &d_o, &sink, None);
    let naive = oracle(p, &q, &k, &v, &d_o, &sink, Some(p.dtype));
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
        oracle_err(&p.layout.o, od, &dec(o), &exact.o),
        oracle_err(&p.layout.o, od, &naive.o, &exact.o),
        &exact.o,
    )];
    let mut lse_err = 0.0f64;
    let mut inf_ok = lse.len() == exact.lse.len();
    for (&g, &w) in lse.iter().zip(&exact.lse) {
        if w == f64::NEG_INFINITY {
            inf_ok &= g == f32::NEG_INFINITY;
            continue;
        }
        let x = (g as f64 - w).abs() / w.abs().max(1.0);
        lse_err = if x.is_nan() {
            f64::INFINITY
        } else {
            lse_err.max(x)
        };
    }
    checks.push(("lse", lse_err, 1e-5, inf_ok && lse_err <= 1e-5));
    if let Some((dq, dk, dv, d_sink)) = grads {
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
                oracle_err(st, dims, &dec(got), want),
                oracle_err(st, dims, nv, want),
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
        let floor = 2.0 * u * exact.d_sink_abs.iter().copied().fold(0.0, f64::max);
        checks.push(("d_sink", err, nerr, err <= 2.0 * nerr + floor + 1e-6));
    }
    let passed = checks.iter().all(|c| c.3);
    (checks, passed)
}
