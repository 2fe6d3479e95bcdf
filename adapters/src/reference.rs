//! `reference`: CPU float64 forward and backward for every shape, mask, window, GQA ratio and
//! layout, and every feature of the problem: soft-capping, off-by-one and learnable sinks (with
//! the sink logits' gradient), per-sequence lengths padded either side or packed. It is the
//! oracle of the tests and what `attn-policy run` uses where no GPU is present.
//!
//! The oracle helpers take the sink logits of a learnable sink as `Option<&[f64]>` (`None`
//! for the other softmaxes) and return every tensor over the problem's full span: padding rows
//! get `O = 0`, `LSE = -inf`, `dQ = 0`, padding keys `dK = dV = 0` (so do rows with no
//! admissible key, whatever their sink). [`forward_f64`] / [`backward_f64`] /
//! [`backward_f64_from_stats`] / [`naive_forward`] / [`naive_backward`] keep their signatures
//! and serve every problem but a learnable sink (they panic there: it needs logits); the
//! `*_sink` variants take the logits and the backwards return [`Grads`] with `d_sink`.
//!
//! Besides the exact float64 path, [`naive_forward`] / [`naive_backward`] simulate the textbook
//! attention computed in the problem's low precision (every intermediate a framework would store
//! is rounded to the dtype): the baseline of the FlashAttention accuracy criterion
//! `err(executor, fp64) <= 2 * err(naive same dtype, fp64)`. With grouped heads (GQA/MQA) the
//! textbook computation expands K and V to every query head, so each query head's dK and dV
//! are stored (rounded) before the expansion's backward sums them: the naive baseline does the
//! same (until 2026-12-06 it summed the group exactly and rounded once, a baseline stricter than
//! any framework's naive attention; cuDNN's grouped dV then missed it on a few seeds).

use crate::executor::{
    BackwardOutput, DeviceIo, DeviceKind, Direction, ExecError, ExecStats, Executor, ForwardOutput,
    HeadDimRange, HostIo, HostOutput, HostTensor, Manifest, Plan, StreamLaunch, Unsupported,
    direction_mismatch, validate_backward_inputs, validate_forward_inputs, validate_sink,
};
use crate::problem::{
    AttentionProblem, DType, EffectiveMask, LayoutKind, MaskKind, SoftmaxKind, Strides,
};
use std::sync::Arc;
use std::time::Instant;

/// Registry name.
pub const NAME: &str = "reference";

/// Largest `b * h_q * s_q * s_kv` the reference accepts (about a minute of CPU time at d=128);
/// larger problems are refused rather than left running for hours.
pub const MAX_SCORE_ELEMENTS: u64 = 1 << 28;

/// The reference's manifest: everything, up to [`MAX_SCORE_ELEMENTS`].
pub fn manifest() -> Manifest {
    Manifest {
        name: NAME.into(),
        device: DeviceKind::Cpu,
        min_compute_capability: None,
        max_compute_capability: None,
        dtypes: vec![DType::F16, DType::BF16, DType::F32, DType::F64],
        head_dim_qk: HeadDimRange {
            min: 1,
            max: 65536,
            multiple_of: 1,
        },
        head_dim_v: HeadDimRange {
            min: 1,
            max: 65536,
            multiple_of: 1,
        },
        head_dim_v_may_differ: true,
        masks: vec![
            MaskKind::NoMask,
            MaskKind::CausalTopLeft,
            MaskKind::CausalBottomRight,
        ],
        windows: true,
        rectangular: true,
        layouts: vec![LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd],
        arbitrary_strides: true,
        stride_multiple_of: 1,
        gqa: true,
        max_seqlen: None,
        max_score_elements: Some(MAX_SCORE_ELEMENTS),
        backward: true,
        deterministic: true,
        features: crate::executor::Features::all(),
        notes: vec![
            "float64 arithmetic on the host; inputs decoded from fp16/bf16/fp32/fp64 exactly".into(),
            "outputs rounded once to the problem dtype (LSE to fp32; fp64 for fp64 problems through forward_strided_lse)".into(),
            "fp32/fp64 through the strided-pointer API (forward_strided/backward_strided); host tensors are fp16/bf16".into(),
            format!("refuses b*h_q*s_q*s_kv > {MAX_SCORE_ELEMENTS} (CPU time)"),
            "learnable sink logits: fp32 [h_q] (host tensors' `sink`, or a host pointer); d_sink fp32 [h_q]".into(),
        ],
    }
}

/// Registry constructor (the device ordinal does not matter on the host).
pub fn create(_ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Ok(Arc::new(Reference))
}

/// The CPU float64 executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reference;

/// How intermediates are rounded.
#[derive(Clone, Copy)]
enum Rounding {
    Exact,
    Dtype(DType),
}

impl Rounding {
    #[inline]
    fn r(self, x: f64) -> f64 {
        match self {
            Rounding::Exact => x,
            Rounding::Dtype(d) => d.round(x),
        }
    }
}

/// The sink logit of every query head for `p`'s softmax, from the caller's logits: `None` for
/// the vanilla softmax, zeros for off-by-one, the given `h_q` logits for a learnable sink.
/// Logits for a learnable problem are required ([`ExecError::InvalidInput`] without them or
/// with another count); logits for another softmax are refused (they would be ignored).
pub fn sink_logits(
    p: &AttentionProblem,
    sink: Option<&[f64]>,
) -> Result<Option<Vec<f64>>, ExecError> {
    validate_sink(p, sink.map(<[f64]>::len))?;
    Ok(match p.softmax {
        SoftmaxKind::Vanilla => None,
        SoftmaxKind::OffByOne => Some(vec![0.0; p.heads_q]),
        SoftmaxKind::Learnable => sink.map(<[f64]>::to_vec),
    })
}

/// [`sink_logits`] for the oracle helpers, which return plain vectors: a mismatch is the
/// caller's programming error.
fn sink_or_panic(p: &AttentionProblem, sink: Option<&[f64]>) -> Option<Vec<f64>> {
    sink_logits(p, sink).unwrap_or_else(|e| panic!("reference oracle: {e}"))
}

/// Gather rows `[start, start + len)` of head `(b, h)` (`[len, d]`) from a strided buffer.
#[allow(clippy::too_many_arguments)]
fn gather(
    x: &[f64],
    st: &Strides,
    b: usize,
    h: usize,
    start: usize,
    len: usize,
    d: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; len * d];
    for i in 0..len {
        let o = st.offset(b, h, start + i, 0);
        out[i * d..(i + 1) * d].copy_from_slice(&x[o..o + d]);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn scatter(
    dst: &mut [f64],
    src: &[f64],
    st: &Strides,
    b: usize,
    h: usize,
    start: usize,
    len: usize,
    d: usize,
) {
    for i in 0..len {
        let o = st.offset(b, h, start + i, 0);
        dst[o..o + d].copy_from_slice(&src[i * d..(i + 1) * d]);
    }
}

/// One sequence of one head, gathered: its queries and keys in the sequence's own coordinates.
struct SeqHead<'a> {
    p: &'a AttentionProblem,
    /// The sequence's mask (own q and kv lengths).
    m: EffectiveMask,
    sq: usize,
    skv: usize,
    /// The head's sink logit, if the softmax has one.
    sink: Option<f64>,
}

/// What the forward of one sequence of one head keeps for the backward.
struct HeadFwd {
    /// Probabilities `[sq, skv]` (0 outside the mask).
    probs: Vec<f64>,
    /// O `[sq, dv]`.
    o: Vec<f64>,
    /// LSE `[sq]` (sink included; `-inf` for rows with no admissible key).
    lse: Vec<f64>,
    /// `1 - tanh^2` of the capped scores `[sq, skv]` (empty without soft-capping).
    dcap: Vec<f64>,
    /// Probability of the sink per row `[sq]` (0 without a sink or for empty rows).
    psink: Vec<f64>,
}

impl SeqHead<'_> {
    /// The score of query `qi` and key `kj` after scaling and capping, and `1 - tanh^2` of the
    /// cap (1 without one); a low-precision framework stores `Q K^T`, the scaled scores, the
    /// tanh and the capped scores.
    #[inline]
    fn score(&self, qi: &[f64], kj: &[f64], rd: Rounding) -> (f64, f64) {
        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
        let s = rd.r(rd.r(dot) * self.p.softmax_scale);
        match self.p.softcap {
            Some(c) => {
                let t = rd.r((s / c).tanh());
                (rd.r(c * t), 1.0 - t * t)
            }
            None => (s, 1.0),
        }
    }

    fn forward(&self, q: &[f64], k: &[f64], v: &[f64], rd: Rounding) -> HeadFwd {
        let (sq, skv, dqk, dv) = (self.sq, self.skv, self.p.head_dim_qk, self.p.head_dim_v);
        let capped = self.p.softcap.is_some();
        let mut f = HeadFwd {
            probs: vec![0.0; sq * skv],
            o: vec![0.0; sq * dv],
            lse: vec![f64::NEG_INFINITY; sq],
            dcap: if capped {
                vec![0.0; sq * skv]
            } else {
                Vec::new()
            },
            psink: vec![0.0; sq],
        };
        let mut row = vec![0.0; skv];
        for i in 0..sq {
            let (lo, hi) = self.m.row_range(i);
            if lo >= hi {
                // No admissible key: the row is empty, whatever its sink.
                continue;
            }
            let (lo, hi) = (lo as usize, hi as usize);
            let qi = &q[i * dqk..(i + 1) * dqk];
            let mut mx = self.sink.unwrap_or(f64::NEG_INFINITY);
            for j in lo..hi {
                let (s, dc) = self.score(qi, &k[j * dqk..(j + 1) * dqk], rd);
                row[j] = s;
                if capped {
                    f.dcap[i * skv + j] = dc;
                }
                mx = mx.max(s);
            }
            let sink_term = self.sink.map_or(0.0, |s| (s - mx).exp());
            let sum: f64 = (lo..hi).map(|j| (row[j] - mx).exp()).sum::<f64>() + sink_term;
            f.lse[i] = mx + sum.ln();
            f.psink[i] = rd.r(sink_term / sum);
            for (pj, s) in f.probs[i * skv + lo..i * skv + hi]
                .iter_mut()
                .zip(&row[lo..hi])
            {
                *pj = rd.r((s - mx).exp() / sum);
            }
            let oi = &mut f.o[i * dv..(i + 1) * dv];
            for j in lo..hi {
                let pj = f.probs[i * skv + j];
                for (a, b) in oi.iter_mut().zip(&v[j * dv..(j + 1) * dv]) {
                    *a += pj * b;
                }
            }
            for a in oi.iter_mut() {
                *a = rd.r(*a);
            }
        }
        f
    }
}

/// The (sequence, head) jobs of a problem: every sequence of the batch, every head in `heads`.
fn jobs(p: &AttentionProblem, heads: usize) -> Vec<(usize, usize)> {
    (0..p.batch)
        .flat_map(|bi| (0..heads).map(move |h| (bi, h)))
        .collect()
}

fn seq_head<'a>(
    p: &'a AttentionProblem,
    bi: usize,
    sinks: &Option<Vec<f64>>,
    h: usize,
) -> SeqHead<'a> {
    let (qr, kr) = p.seq_rows(bi);
    SeqHead {
        p,
        m: p.seq_mask(bi),
        sq: qr.len,
        skv: kr.len,
        sink: sinks.as_ref().map(|s| s[h]),
    }
}

/// Forward of every sequence and head: `(O, LSE)` over the problem's full spans, padding rows
/// `O = 0`, `LSE = -inf`.
fn forward_impl(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sinks: &Option<Vec<f64>>,
    rd: Rounding,
) -> (Vec<f64>, Vec<f64>) {
    let (hq, dqk, dv) = (p.heads_q, p.head_dim_qk, p.head_dim_v);
    let ratio = p.group_size();
    let mut o = vec![0.0; p.o_span()];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len()];
    let jobs = jobs(p, hq);
    let results = parallel_map(&jobs, |&(bi, h)| {
        let g = h / ratio;
        let (qr, kr) = p.seq_rows(bi);
        let qh = gather(q, &p.layout.q, qr.batch, h, qr.start, qr.len, dqk);
        let kh = gather(k, &p.layout.k, kr.batch, g, kr.start, kr.len, dqk);
        let vh = gather(v, &p.layout.v, kr.batch, g, kr.start, kr.len, dv);
        let f = seq_head(p, bi, sinks, h).forward(&qh, &kh, &vh, rd);
        (f.o, f.lse)
    });
    for (&(bi, h), (oh, lh)) in jobs.iter().zip(results) {
        let (qr, _) = p.seq_rows(bi);
        scatter(&mut o, &oh, &p.layout.o, qr.batch, h, qr.start, qr.len, dv);
        for (i, l) in lh.into_iter().enumerate() {
            lse[p.lse_index(qr.batch, h, qr.start + i)] = l;
        }
    }
    (o, lse)
}

/// Gradients of the reference's backward: dQ, dK, dV over the problem's full spans (strides of
/// Q, K, V; padding rows and keys 0) and the gradient of the sink logits `[h_q]` (learnable
/// sink only, else empty).
#[derive(Clone, Debug, PartialEq)]
pub struct Grads {
    /// dQ, strides of Q.
    pub dq: Vec<f64>,
    /// dK, strides of K.
    pub dk: Vec<f64>,
    /// dV, strides of V.
    pub dv: Vec<f64>,
    /// d(sink logits) `[h_q]` of a learnable sink; empty for the other softmaxes.
    pub d_sink: Vec<f64>,
}

/// One (sequence, KV group) job's gradients: dQ of each query head in the group, dK, dV, and
/// the sink gradient of each query head in the group.
struct GroupGrads {
    dqs: Vec<Vec<f64>>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dsink: Vec<f64>,
}

/// dS of one row from P, dP - D and the cap's derivative, and the row's contributions to dQ,
/// dK, dV (shared by both backwards: they differ in where P comes from).
struct RowGrad<'a> {
    qi: &'a [f64],
    doi: &'a [f64],
    dsum: f64,
    dqi: &'a mut [f64],
}

impl RowGrad<'_> {
    /// Accumulate key `j`'s contribution with probability `pij` and cap derivative `dcap`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn key(
        &mut self,
        pij: f64,
        dcap: f64,
        kj: &[f64],
        vj: &[f64],
        dkj: &mut [f64],
        dvj: &mut [f64],
        rd: Rounding,
    ) {
        let dp = rd.r(self.doi.iter().zip(vj).map(|(a, b)| a * b).sum::<f64>());
        let mut ds = rd.r(pij * (dp - self.dsum));
        if dcap != 1.0 {
            ds = rd.r(ds * dcap);
        }
        for (a, b) in dvj.iter_mut().zip(self.doi) {
            *a += pij * b;
        }
        if ds == 0.0 {
            return;
        }
        for (a, b) in self.dqi.iter_mut().zip(kj) {
            *a += ds * b;
        }
        for (a, b) in dkj.iter_mut().zip(self.qi) {
            *a += ds * b;
        }
    }
}

#[inline]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn backward_impl(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sinks: &Option<Vec<f64>>,
    rd: Rounding,
) -> Grads {
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let ratio = p.group_size();
    let scale = p.softmax_scale;
    let jobs = jobs(p, p.heads_kv);
    let results = parallel_map(&jobs, |&(bi, g)| {
        let (qr, kr) = p.seq_rows(bi);
        let (sq, skv) = (qr.len, kr.len);
        let kh = gather(k, &p.layout.k, kr.batch, g, kr.start, skv, dqk);
        let vh = gather(v, &p.layout.v, kr.batch, g, kr.start, skv, dv);
        let mut gg = GroupGrads {
            dqs: Vec::with_capacity(ratio),
            dk: vec![0.0; skv * dqk],
            dv: vec![0.0; skv * dv],
            dsink: vec![0.0; ratio],
        };
        // Each query head's dK and dV, before the group's sum: the naive baseline rounds them
        // (as attention on KV expanded to every query head does, whose expansion's backward
        // then sums the heads' rounded gradients); the exact one keeps them.
        let mut hdk = vec![0.0; skv * dqk];
        let mut hdv = vec![0.0; skv * dv];
        for r in 0..ratio {
            let h = g * ratio + r;
            let qh = gather(q, &p.layout.q, qr.batch, h, qr.start, sq, dqk);
            let doh = gather(d_o, &p.layout.o, qr.batch, h, qr.start, sq, dv);
            let f = seq_head(p, bi, sinks, h).forward(&qh, &kh, &vh, rd);
            let mut dq = vec![0.0; sq * dqk];
            hdk.fill(0.0);
            hdv.fill(0.0);
            for i in 0..sq {
                if f.lse[i] == f64::NEG_INFINITY {
                    continue;
                }
                let doi = &doh[i * dv..(i + 1) * dv];
                // D = rowsum(dO * O); equals rowsum(P * dP) in exact arithmetic (the sink adds
                // no term: it has no value row).
                let dsum = dot(doi, &f.o[i * dv..(i + 1) * dv]);
                // d(sink) = sum over rows of dS of the sink column = P_sink * (0 - D).
                gg.dsink[r] -= rd.r(f.psink[i] * dsum);
                let mut row = RowGrad {
                    qi: &qh[i * dqk..(i + 1) * dqk],
                    doi,
                    dsum,
                    dqi: &mut dq[i * dqk..(i + 1) * dqk],
                };
                for j in 0..skv {
                    let pij = f.probs[i * skv + j];
                    if pij == 0.0 {
                        continue;
                    }
                    let dcap = if f.dcap.is_empty() {
                        1.0
                    } else {
                        f.dcap[i * skv + j]
                    };
                    row.key(
                        pij,
                        dcap,
                        &kh[j * dqk..(j + 1) * dqk],
                        &vh[j * dv..(j + 1) * dv],
                        &mut hdk[j * dqk..(j + 1) * dqk],
                        &mut hdv[j * dv..(j + 1) * dv],
                        rd,
                    );
                }
                for a in row.dqi.iter_mut() {
                    *a = rd.r(*a * scale);
                }
            }
            gg.dqs.push(dq);
            for (a, b) in gg.dk.iter_mut().zip(&hdk) {
                *a += rd.r(b * scale);
            }
            for (a, b) in gg.dv.iter_mut().zip(&hdv) {
                *a += rd.r(*b);
            }
        }
        // One head (MHA): rounding again changes nothing.
        for a in gg.dk.iter_mut().chain(gg.dv.iter_mut()) {
            *a = rd.r(*a);
        }
        gg
    });
    scatter_group_grads(p, &jobs, results, rd)
}

/// Writes every job's gradients into full-size dQ, dK, dV in the problem's strides and sums the
/// sink gradients over the sequences (shared by both backward passes: they differ in the math,
/// not in where the results go).
fn scatter_group_grads(
    p: &AttentionProblem,
    jobs: &[(usize, usize)],
    results: Vec<GroupGrads>,
    rd: Rounding,
) -> Grads {
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let ratio = p.group_size();
    let mut out = Grads {
        dq: vec![0.0; p.q_span()],
        dk: vec![0.0; p.k_span()],
        dv: vec![0.0; p.v_span()],
        d_sink: vec![0.0; p.sink_len()],
    };
    for (&(bi, g), gg) in jobs.iter().zip(results) {
        let (qr, kr) = p.seq_rows(bi);
        for (r, dqh) in gg.dqs.iter().enumerate() {
            let h = g * ratio + r;
            scatter(
                &mut out.dq,
                dqh,
                &p.layout.q,
                qr.batch,
                h,
                qr.start,
                qr.len,
                dqk,
            );
        }
        scatter(
            &mut out.dk,
            &gg.dk,
            &p.layout.k,
            kr.batch,
            g,
            kr.start,
            kr.len,
            dqk,
        );
        scatter(
            &mut out.dv,
            &gg.dv,
            &p.layout.v,
            kr.batch,
            g,
            kr.start,
            kr.len,
            dv,
        );
        if !out.d_sink.is_empty() {
            for (r, d) in gg.dsink.iter().enumerate() {
                out.d_sink[g * ratio + r] += d;
            }
        }
    }
    for d in out.d_sink.iter_mut() {
        *d = rd.r(*d);
    }
    out
}

/// Cores available to this process, read once: `available_parallelism` reads cgroup files on
/// Linux (tens of microseconds), which a framework's small per-call problems would pay each time.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Map `f` over `items` on all available cores, preserving order.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = cores().min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= items.len() {
                            break;
                        }
                        mine.push((i, f(&items[i])));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("reference worker panicked"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Exact float64 forward on strided f64 buffers (Q/K/V/O strides from the problem), every
/// feature of the problem served (soft-capping, off-by-one sink, per-sequence lengths).
/// Returns `(O, LSE)` over the full spans (`O`: `p.o_span()` elements, strides of O; LSE
/// `[batch_dim, h_q, rows_q]`, natural log, sink included); padding rows and rows with no
/// admissible key get `O = 0`, `LSE = -inf`.
///
/// # Panics
/// For a learnable-sink problem (it needs logits: use [`forward_f64_sink`]).
pub fn forward_f64(p: &AttentionProblem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    forward_f64_sink(p, q, k, v, None)
}

/// [`forward_f64`] with the sink logits `[h_q]` of a learnable sink (`None` for the other
/// softmaxes).
///
/// # Panics
/// When `sink` does not fit the problem ([`sink_logits`]: learnable without `h_q` logits, or
/// logits for another softmax).
pub fn forward_f64_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sink: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    forward_impl(p, q, k, v, &sink_or_panic(p, sink), Rounding::Exact)
}

/// Exact float64 backward: `(dQ, dK, dV)` for upstream gradient `d_o` (strides of O), full
/// spans, padding rows and keys 0.
///
/// # Panics
/// For a learnable-sink problem (use [`backward_f64_sink`], which also returns d_sink).
pub fn backward_f64(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let g = backward_f64_sink(p, q, k, v, d_o, None);
    (g.dq, g.dk, g.dv)
}

/// Exact float64 backward with the sink logits of a learnable sink (`None` otherwise): dQ, dK,
/// dV and, for a learnable sink, `d_sink` `[h_q]` (`-sum_i exp(s_h - LSE_i) * D_i` over every
/// sequence's non-empty rows of head `h`).
///
/// # Panics
/// When `sink` does not fit the problem (see [`forward_f64_sink`]).
pub fn backward_f64_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sink: Option<&[f64]>,
) -> Grads {
    backward_impl(p, q, k, v, d_o, &sink_or_panic(p, sink), Rounding::Exact)
}

/// Exact float64 backward from the forward's statistics, as the GPU executors compute it:
/// `P = exp(S - LSE)` on admissible keys (`S` the scaled, capped scores) and
/// `D = rowsum(dO * O)` with the given `o` (strides of O) and `lse` (`[batch_dim, h_q, rows_q]`,
/// natural log, sink included). With the call's own O and LSE this is [`backward_f64`]; with
/// the O and LSE of a larger softmax that this call is one key block of (a context-parallel
/// ring step), it is that softmax's gradient restricted to the block, which a recomputing
/// backward cannot give. Rows whose LSE is `-inf` contribute nothing.
///
/// # Panics
/// For a learnable-sink problem (use [`backward_f64_from_stats_sink`]).
pub fn backward_f64_from_stats(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let g = backward_f64_from_stats_sink(p, q, k, v, o, lse, d_o, None);
    (g.dq, g.dk, g.dv)
}

/// [`backward_f64_from_stats`] with the sink logits of a learnable sink (`None` otherwise),
/// returning `d_sink` too (`-sum_i exp(s_h - LSE_i) * D_i`, from the given LSE).
///
/// # Panics
/// When `sink` does not fit the problem (see [`forward_f64_sink`]).
#[allow(clippy::too_many_arguments)]
pub fn backward_f64_from_stats_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
    sink: Option<&[f64]>,
) -> Grads {
    from_stats_impl(p, q, k, v, o, lse, d_o, &sink_or_panic(p, sink))
}

#[allow(clippy::too_many_arguments)]
fn from_stats_impl(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
    sinks: &Option<Vec<f64>>,
) -> Grads {
    let (dqk, dv) = (p.head_dim_qk, p.head_dim_v);
    let (ratio, scale) = (p.group_size(), p.softmax_scale);
    let rd = Rounding::Exact;
    let jobs = jobs(p, p.heads_kv);
    let results = parallel_map(&jobs, |&(bi, g)| {
        let (qr, kr) = p.seq_rows(bi);
        let (sq, skv) = (qr.len, kr.len);
        let kh = gather(k, &p.layout.k, kr.batch, g, kr.start, skv, dqk);
        let vh = gather(v, &p.layout.v, kr.batch, g, kr.start, skv, dv);
        let mut gg = GroupGrads {
            dqs: Vec::with_capacity(ratio),
            dk: vec![0.0; skv * dqk],
            dv: vec![0.0; skv * dv],
            dsink: vec![0.0; ratio],
        };
        for r in 0..ratio {
            let h = g * ratio + r;
            let sh = seq_head(p, bi, sinks, h);
            let qh = gather(q, &p.layout.q, qr.batch, h, qr.start, sq, dqk);
            let oh = gather(o, &p.layout.o, qr.batch, h, qr.start, sq, dv);
            let doh = gather(d_o, &p.layout.o, qr.batch, h, qr.start, sq, dv);
            let mut dq = vec![0.0; sq * dqk];
            for i in 0..sq {
                let (lo, hi) = sh.m.row_range(i);
                let li = lse[p.lse_index(qr.batch, h, qr.start + i)];
                if lo >= hi || li == f64::NEG_INFINITY {
                    continue;
                }
                let doi = &doh[i * dv..(i + 1) * dv];
                let dsum = dot(doi, &oh[i * dv..(i + 1) * dv]);
                if let Some(s) = sh.sink {
                    gg.dsink[r] -= (s - li).exp() * dsum;
                }
                let qi = &qh[i * dqk..(i + 1) * dqk];
                let mut row = RowGrad {
                    qi,
                    doi,
                    dsum,
                    dqi: &mut dq[i * dqk..(i + 1) * dqk],
                };
                for j in lo as usize..hi as usize {
                    let kj = &kh[j * dqk..(j + 1) * dqk];
                    let (s, dcap) = sh.score(qi, kj, rd);
                    row.key(
                        (s - li).exp(),
                        dcap,
                        kj,
                        &vh[j * dv..(j + 1) * dv],
                        &mut gg.dk[j * dqk..(j + 1) * dqk],
                        &mut gg.dv[j * dv..(j + 1) * dv],
                        rd,
                    );
                }
                for a in row.dqi.iter_mut() {
                    *a *= scale;
                }
            }
            gg.dqs.push(dq);
        }
        for a in gg.dk.iter_mut() {
            *a *= scale;
        }
        gg
    });
    scatter_group_grads(p, &jobs, results, rd)
}

/// Textbook attention with every stored intermediate (scores, capped scores, probabilities,
/// dP, dS, outputs) rounded to `p.dtype`: the "naive same-dtype" baseline. Returns `(O, LSE)`.
///
/// # Panics
/// For a learnable-sink problem (use [`naive_forward_sink`]).
pub fn naive_forward(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    naive_forward_sink(p, q, k, v, None)
}

/// [`naive_forward`] with the sink logits of a learnable sink (`None` otherwise).
///
/// # Panics
/// When `sink` does not fit the problem (see [`forward_f64_sink`]).
pub fn naive_forward_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sink: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    forward_impl(
        p,
        q,
        k,
        v,
        &sink_or_panic(p, sink),
        Rounding::Dtype(p.dtype),
    )
}

/// Backward of [`naive_forward`], same rounding. Returns `(dQ, dK, dV)`.
///
/// # Panics
/// For a learnable-sink problem (use [`naive_backward_sink`]).
pub fn naive_backward(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let g = naive_backward_sink(p, q, k, v, d_o, None);
    (g.dq, g.dk, g.dv)
}

/// [`naive_backward`] with the sink logits of a learnable sink (`None` otherwise), returning
/// `d_sink` too (each row's term and the sum rounded to the dtype).
///
/// # Panics
/// When `sink` does not fit the problem (see [`forward_f64_sink`]).
pub fn naive_backward_sink(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sink: Option<&[f64]>,
) -> Grads {
    backward_impl(
        p,
        q,
        k,
        v,
        d_o,
        &sink_or_panic(p, sink),
        Rounding::Dtype(p.dtype),
    )
}

/// Decode a host tensor into f64.
pub fn decode(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&b| t.dtype.from_bits(b)).collect()
}

/// Encode f64 values as a host tensor of `dtype`.
pub fn encode(dtype: DType, x: &[f64]) -> HostTensor {
    HostTensor {
        dtype,
        data: x.iter().map(|&v| dtype.to_bits(v)).collect(),
    }
}

/// Reads element `i` (in elements) of `dtype` at `base`.
///
/// # Safety
/// `base + i * size` must be readable for one element (alignment not required).
unsafe fn read_elem(base: *const u8, dtype: DType, i: usize) -> f64 {
    // SAFETY: per the contract; unaligned reads.
    unsafe {
        let at = base.add(i * dtype.size_bytes());
        match dtype {
            DType::F16 => half::f16::from_bits(at.cast::<u16>().read_unaligned()).to_f64(),
            DType::BF16 => half::bf16::from_bits(at.cast::<u16>().read_unaligned()).to_f64(),
            DType::F32 => at.cast::<f32>().read_unaligned() as f64,
            DType::F64 => at.cast::<f64>().read_unaligned(),
        }
    }
}

/// Writes `x` rounded to `dtype` as element `i` at `base`.
///
/// # Safety
/// `base + i * size` must be writable for one element (alignment not required).
unsafe fn write_elem(base: *mut u8, dtype: DType, i: usize, x: f64) {
    // SAFETY: per the contract; unaligned writes.
    unsafe {
        let at = base.add(i * dtype.size_bytes());
        match dtype {
            DType::F16 => at
                .cast::<u16>()
                .write_unaligned(half::f16::from_f64(x).to_bits()),
            DType::BF16 => at
                .cast::<u16>()
                .write_unaligned(half::bf16::from_f64(x).to_bits()),
            DType::F32 => at.cast::<f32>().write_unaligned(x as f32),
            DType::F64 => at.cast::<f64>().write_unaligned(x),
        }
    }
}

/// Gathers a strided `[b, h, s, d]` tensor into a contiguous `bhsd` f64 buffer.
///
/// # Safety
/// Every element the strides address must be readable.
unsafe fn gather_raw(
    base: *const u8,
    dtype: DType,
    st: &Strides,
    (b, h, s, d): (usize, usize, usize, usize),
) -> Vec<f64> {
    let mut out = Vec::with_capacity(b * h * s * d);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let o = st.offset(bi, hi, si, 0);
                // SAFETY: per the contract.
                out.extend((0..d).map(|di| unsafe { read_elem(base, dtype, o + di) }));
            }
        }
    }
    out
}

/// Scatters a contiguous `bhsd` f64 buffer into a strided tensor, rounding to `dtype`.
///
/// # Safety
/// Every element the strides address must be writable.
unsafe fn scatter_raw(
    base: *mut u8,
    dtype: DType,
    st: &Strides,
    (b, h, s, d): (usize, usize, usize, usize),
    src: &[f64],
) {
    let mut it = src.iter();
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let o = st.offset(bi, hi, si, 0);
                for di in 0..d {
                    let x = *it.next().unwrap_or(&f64::NAN);
                    // SAFETY: per the contract.
                    unsafe { write_elem(base, dtype, o + di, x) };
                }
            }
        }
    }
}

/// `p` with every tensor contiguous `bhsd` (the compact buffers of the strided API).
fn compact(p: &AttentionProblem) -> AttentionProblem {
    p.clone().with_layout(LayoutKind::Bhsd)
}

/// Forward on host memory of any strides (in elements, head dim contiguous) and any dtype of
/// the manifest (fp16, bf16, fp32, fp64), float64 inside: writes O (strides `p.layout.o`,
/// rounded once to `p.dtype`) and LSE (`[batch_dim, h_q, rows_q]` contiguous fp32, natural log, `-inf`
/// for rows with no admissible key). This is how framework CPU tensors reach the reference.
///
/// # Safety
/// `q`, `k`, `v` must be readable and `o` writable at every element their strides address,
/// `lse` writable for `p.lse_len()` floats, and outputs must not alias inputs.
pub unsafe fn forward_strided(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    o: *mut u8,
    lse: *mut f32,
) -> Result<(), ExecError> {
    // SAFETY: per the contract.
    unsafe { forward_strided_lse(p, q, k, v, o, LseOut::F32(lse)) }
}

/// Where a strided call writes LSE (`[batch_dim, h_q, rows_q]`, contiguous, natural log:
/// `[b, h_q, s_q]` unless packed).
#[derive(Clone, Copy, Debug)]
pub enum LseOut {
    /// fp32, the convention of every executor.
    F32(*mut f32),
    /// fp64: float64 problems of `attn_policy.torch`, so that merging partial results by
    /// log-sum-exp (context parallelism) keeps float64 accuracy.
    F64(*mut f64),
}

/// Where a strided backward reads LSE (see [`LseOut`]).
#[derive(Clone, Copy, Debug)]
pub enum LseIn {
    /// fp32.
    F32(*const f32),
    /// fp64.
    F64(*const f64),
}

/// [`forward_strided`] writing LSE as fp32 or fp64.
///
/// # Safety
/// As for [`forward_strided`]; `lse` writable for `p.lse_len()` elements of its type.
pub unsafe fn forward_strided_lse(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    o: *mut u8,
    lse: LseOut,
) -> Result<(), ExecError> {
    // SAFETY: per the contract (no sink pointer).
    unsafe { forward_strided_sink(p, q, k, v, o, lse, std::ptr::null()) }
}

/// Reads the `h_q` sink logits at `sink` (null: none) and resolves them for `p`
/// ([`sink_logits`]).
///
/// # Safety
/// A non-null `sink` must be readable for `p.heads_q` floats.
unsafe fn read_sinks(
    p: &AttentionProblem,
    sink: *const f32,
) -> Result<Option<Vec<f64>>, ExecError> {
    let given = (!sink.is_null()).then(|| {
        (0..p.heads_q)
            // SAFETY: per the contract.
            .map(|i| unsafe { sink.add(i).read_unaligned() } as f64)
            .collect::<Vec<f64>>()
    });
    sink_logits(p, given.as_deref())
}

/// [`forward_strided_lse`] with the sink logits `[h_q]` fp32 of a learnable sink at `sink`
/// (null for the other softmaxes; a learnable problem without them is
/// [`ExecError::InvalidInput`]). Every element of O and LSE is written, padding rows included
/// (`O = 0`, `LSE = -inf`).
///
/// # Safety
/// As for [`forward_strided_lse`]; a non-null `sink` readable for `p.heads_q` floats.
pub unsafe fn forward_strided_sink(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    o: *mut u8,
    lse: LseOut,
    sink: *const f32,
) -> Result<(), ExecError> {
    manifest().admits(p)?;
    let lse_null = match lse {
        LseOut::F32(x) => x.is_null(),
        LseOut::F64(x) => x.is_null(),
    };
    if [q, k, v].iter().any(|x| x.is_null()) || o.is_null() || lse_null {
        return Err(ExecError::invalid("null pointer"));
    }
    // SAFETY: per the contract.
    let sinks = unsafe { read_sinks(p, sink)? };
    let (b, hq, hkv) = (p.batch_dim(), p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dv) = (p.rows_q(), p.rows_kv(), p.head_dim_qk, p.head_dim_v);
    // SAFETY: per the contract.
    let (qc, kc, vc) = unsafe {
        (
            gather_raw(q, p.dtype, &p.layout.q, (b, hq, sq, dqk)),
            gather_raw(k, p.dtype, &p.layout.k, (b, hkv, skv, dqk)),
            gather_raw(v, p.dtype, &p.layout.v, (b, hkv, skv, dv)),
        )
    };
    let c = compact(p);
    let (oc, lc) = forward_impl(&c, &qc, &kc, &vc, &sinks, Rounding::Exact);
    // SAFETY: per the contract.
    unsafe {
        scatter_raw(o, p.dtype, &p.layout.o, (b, hq, sq, dv), &oc);
        for (i, x) in lc.iter().enumerate() {
            match lse {
                LseOut::F32(l) => l.add(i).write_unaligned(*x as f32),
                LseOut::F64(l) => l.add(i).write_unaligned(*x),
            }
        }
    }
    Ok(())
}

/// Backward on host memory of any strides and dtype (see [`forward_strided`]): writes dQ, dK,
/// dV (strides of Q, K, V) for the upstream gradient `d_o` (strides of O), recomputing the
/// forward in float64 from Q, K, V.
///
/// # Safety
/// Inputs readable and outputs writable at every element their strides address; outputs must
/// not alias inputs or each other.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_strided(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    d_o: *const u8,
    dq: *mut u8,
    dk: *mut u8,
    dv: *mut u8,
) -> Result<(), ExecError> {
    manifest().admits(p)?;
    if [q, k, v, d_o].iter().any(|x| x.is_null()) || [dq, dk, dv].iter().any(|x| x.is_null()) {
        return Err(ExecError::invalid("null pointer"));
    }
    // No sink logits here: a learnable problem is refused (backward_strided_from_stats_sink
    // takes them).
    let sinks = sink_logits(p, None)?;
    let (b, hq, hkv) = (p.batch_dim(), p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dvd) = (p.rows_q(), p.rows_kv(), p.head_dim_qk, p.head_dim_v);
    // SAFETY: per the contract.
    let (qc, kc, vc, doc) = unsafe {
        (
            gather_raw(q, p.dtype, &p.layout.q, (b, hq, sq, dqk)),
            gather_raw(k, p.dtype, &p.layout.k, (b, hkv, skv, dqk)),
            gather_raw(v, p.dtype, &p.layout.v, (b, hkv, skv, dvd)),
            gather_raw(d_o, p.dtype, &p.layout.o, (b, hq, sq, dvd)),
        )
    };
    let c = compact(p);
    let g = backward_impl(&c, &qc, &kc, &vc, &doc, &sinks, Rounding::Exact);
    let (gq, gk, gv) = (g.dq, g.dk, g.dv);
    // SAFETY: per the contract.
    unsafe {
        scatter_raw(dq, p.dtype, &p.layout.q, (b, hq, sq, dqk), &gq);
        scatter_raw(dk, p.dtype, &p.layout.k, (b, hkv, skv, dqk), &gk);
        scatter_raw(dv, p.dtype, &p.layout.v, (b, hkv, skv, dvd), &gv);
    }
    Ok(())
}

/// Backward on host memory of any strides and dtype from the forward's statistics (see
/// [`backward_f64_from_stats`]): reads O (strides of O) and LSE (`[batch_dim, h_q, rows_q]` contiguous,
/// fp32 or fp64) instead of recomputing them, as the GPU executors do. This is what
/// `attn_policy.torch` calls, so a key block of a larger softmax (a context-parallel step) gets
/// that softmax's gradient.
///
/// # Safety
/// Inputs readable and outputs writable at every element their strides address (LSE:
/// `p.lse_len()` elements); outputs must not alias inputs or each other.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_strided_from_stats(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    o: *const u8,
    d_o: *const u8,
    lse: LseIn,
    dq: *mut u8,
    dk: *mut u8,
    dv: *mut u8,
) -> Result<(), ExecError> {
    // SAFETY: per the contract (no sink pointers).
    unsafe {
        backward_strided_from_stats_sink(
            p,
            q,
            k,
            v,
            o,
            d_o,
            lse,
            dq,
            dk,
            dv,
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    }
}

/// [`backward_strided_from_stats`] with the sink logits `[h_q]` fp32 of a learnable sink at
/// `sink` and its gradient written to `d_sink` (`[h_q]` fp32, overwritten); both null for the
/// other softmaxes. A learnable problem without either is [`ExecError::InvalidInput`]. Every
/// element of dQ, dK, dV is written, padding rows and keys included (0).
///
/// # Safety
/// As for [`backward_strided_from_stats`]; non-null `sink` readable and `d_sink` writable for
/// `p.heads_q` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_strided_from_stats_sink(
    p: &AttentionProblem,
    q: *const u8,
    k: *const u8,
    v: *const u8,
    o: *const u8,
    d_o: *const u8,
    lse: LseIn,
    dq: *mut u8,
    dk: *mut u8,
    dv: *mut u8,
    sink: *const f32,
    d_sink: *mut f32,
) -> Result<(), ExecError> {
    manifest().admits(p)?;
    let lse_null = match lse {
        LseIn::F32(x) => x.is_null(),
        LseIn::F64(x) => x.is_null(),
    };
    if [q, k, v, o, d_o].iter().any(|x| x.is_null())
        || [dq, dk, dv].iter().any(|x| x.is_null())
        || lse_null
    {
        return Err(ExecError::invalid("null pointer"));
    }
    // SAFETY: per the contract.
    let sinks = unsafe { read_sinks(p, sink)? };
    if p.softmax == SoftmaxKind::Learnable && d_sink.is_null() {
        return Err(ExecError::invalid(
            "a learnable sink's backward needs its d_sink output",
        ));
    }
    let (b, hq, hkv) = (p.batch_dim(), p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dvd) = (p.rows_q(), p.rows_kv(), p.head_dim_qk, p.head_dim_v);
    // SAFETY: per the contract.
    let (qc, kc, vc, oc, doc, lc) = unsafe {
        (
            gather_raw(q, p.dtype, &p.layout.q, (b, hq, sq, dqk)),
            gather_raw(k, p.dtype, &p.layout.k, (b, hkv, skv, dqk)),
            gather_raw(v, p.dtype, &p.layout.v, (b, hkv, skv, dvd)),
            gather_raw(o, p.dtype, &p.layout.o, (b, hq, sq, dvd)),
            gather_raw(d_o, p.dtype, &p.layout.o, (b, hq, sq, dvd)),
            (0..p.lse_len())
                .map(|i| match lse {
                    LseIn::F32(l) => l.add(i).read_unaligned() as f64,
                    LseIn::F64(l) => l.add(i).read_unaligned(),
                })
                .collect::<Vec<f64>>(),
        )
    };
    let c = compact(p);
    let g = from_stats_impl(&c, &qc, &kc, &vc, &oc, &lc, &doc, &sinks);
    let (gq, gk, gv) = (g.dq, g.dk, g.dv);
    // SAFETY: per the contract.
    unsafe {
        scatter_raw(dq, p.dtype, &p.layout.q, (b, hq, sq, dqk), &gq);
        scatter_raw(dk, p.dtype, &p.layout.k, (b, hkv, skv, dqk), &gk);
        scatter_raw(dv, p.dtype, &p.layout.v, (b, hkv, skv, dvd), &gv);
        if p.softmax == SoftmaxKind::Learnable {
            for (i, x) in g.d_sink.iter().enumerate() {
                d_sink.add(i).write_unaligned(*x as f32);
            }
        }
    }
    Ok(())
}

impl Executor for Reference {
    fn name(&self) -> &str {
        NAME
    }

    fn device_description(&self) -> String {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!("host CPU, float64, {n} threads")
    }

    fn manifest(&self) -> Manifest {
        manifest()
    }

    fn check(&self, problem: &AttentionProblem) -> Result<(), Unsupported> {
        manifest().admits(problem)
    }

    fn plan(
        &self,
        problem: &AttentionProblem,
        direction: Direction,
    ) -> Result<Arc<dyn Plan>, ExecError> {
        self.check(problem)?;
        Ok(Arc::new(ReferencePlan {
            p: problem.clone(),
            direction,
        }))
    }
}

/// The reference's plan: the problem and the direction; nothing to build.
struct ReferencePlan {
    p: AttentionProblem,
    direction: Direction,
}

impl Plan for ReferencePlan {
    fn executor(&self) -> &str {
        NAME
    }

    fn direction(&self) -> Direction {
        self.direction
    }

    /// The host needs no workspace.
    fn workspace_bytes(&self) -> Result<u64, ExecError> {
        Ok(0)
    }

    /// Runs on host memory of any strides and dtype, synchronously: [`forward_strided_sink`] /
    /// [`backward_strided_from_stats_sink`], the LSE fp64 for fp64 problems and fp32 otherwise;
    /// `sink` / `d_sink` are host pointers to `[h_q]` fp32 (0 unless the sink is learnable).
    /// `launch` is ignored (the host has no stream).
    unsafe fn enqueue(&self, io: &DeviceIo, launch: &StreamLaunch) -> Result<(), ExecError> {
        let _ = launch;
        let p = &self.p;
        let f64_lse = p.dtype == DType::F64;
        if io.direction() != self.direction {
            return Err(direction_mismatch(self.direction, io.direction()));
        }
        match io {
            DeviceIo::Forward(a) => {
                let lse = if f64_lse {
                    LseOut::F64(a.lse as *mut f64)
                } else {
                    LseOut::F32(a.lse as *mut f32)
                };
                // SAFETY: the caller's contract (host pointers covering the problem's spans).
                unsafe {
                    forward_strided_sink(
                        p,
                        a.q as *const u8,
                        a.k as *const u8,
                        a.v as *const u8,
                        a.o as *mut u8,
                        lse,
                        a.sink as *const f32,
                    )
                }
            }
            DeviceIo::Backward(a) => {
                let lse = if f64_lse {
                    LseIn::F64(a.lse as *const f64)
                } else {
                    LseIn::F32(a.lse as *const f32)
                };
                // SAFETY: the caller's contract (host pointers covering the problem's spans).
                unsafe {
                    backward_strided_from_stats_sink(
                        p,
                        a.q as *const u8,
                        a.k as *const u8,
                        a.v as *const u8,
                        a.o as *const u8,
                        a.d_o as *const u8,
                        lse,
                        a.dq as *mut u8,
                        a.dk as *mut u8,
                        a.dv as *mut u8,
                        a.sink as *const f32,
                        a.d_sink as *mut f32,
                    )
                }
            }
        }
    }

    /// The backward recomputes the forward in float64 from Q, K, V (the given O and LSE are
    /// validated but not used, so the result is the exact gradient of the inputs' function).
    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        if io.direction() != self.direction {
            return Err(direction_mismatch(self.direction, io.direction()));
        }
        let p = &self.p;
        match io {
            HostIo::Forward(inputs) => {
                validate_forward_inputs(p, &inputs)?;
                let (q, k, v) = (decode(inputs.q), decode(inputs.k), decode(inputs.v));
                let sink: Option<Vec<f64>> =
                    inputs.sink.map(|s| s.iter().map(|&x| x as f64).collect());
                let sinks = sink_logits(p, sink.as_deref())?;
                let t = Instant::now();
                let (o, lse) = forward_impl(p, &q, &k, &v, &sinks, Rounding::Exact);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                Ok(HostOutput::Forward(ForwardOutput {
                    o: encode(p.dtype, &o),
                    lse: lse.iter().map(|&x| x as f32).collect(),
                    stats: host_stats(ms),
                }))
            }
            HostIo::Backward(inputs) => {
                validate_backward_inputs(p, &inputs)?;
                let (q, k, v, d_o) = (
                    decode(inputs.q),
                    decode(inputs.k),
                    decode(inputs.v),
                    decode(inputs.d_o),
                );
                let sink: Option<Vec<f64>> =
                    inputs.sink.map(|s| s.iter().map(|&x| x as f64).collect());
                let sinks = sink_logits(p, sink.as_deref())?;
                let t = Instant::now();
                let g = backward_impl(p, &q, &k, &v, &d_o, &sinks, Rounding::Exact);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                Ok(HostOutput::Backward(BackwardOutput {
                    dq: encode(p.dtype, &g.dq),
                    dk: encode(p.dtype, &g.dk),
                    dv: encode(p.dtype, &g.dv),
                    stats: host_stats(ms),
                    d_sink: g.d_sink.iter().map(|&x| x as f32).collect(),
                }))
            }
        }
    }
}

fn host_stats(compute_ms: f64) -> ExecStats {
    ExecStats {
        compute_ms,
        workspace_bytes: 0,
        peak_bytes: None,
    }
}
