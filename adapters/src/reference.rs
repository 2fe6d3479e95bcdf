//! `reference`: CPU float64 forward and backward for every shape, mask, window, GQA ratio and
//! layout. It is the oracle of the tests and what `attn-policy run` uses where no GPU is present.
//!
//! Besides the exact float64 path, [`naive_forward`] / [`naive_backward`] simulate the textbook
//! attention computed in the problem's low precision (every intermediate a framework would store
//! is rounded to the dtype): the baseline of the FlashAttention accuracy criterion
//! `err(executor, fp64) <= 2 * err(naive same dtype, fp64)`.

use crate::executor::{
    BackwardOutput, DeviceIo, DeviceKind, Direction, ExecError, ExecStats, Executor, ForwardOutput,
    HeadDimRange, HostIo, HostOutput, HostTensor, Manifest, Plan, StreamLaunch, Unsupported,
    direction_mismatch, validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::{AttentionProblem, DType, LayoutKind, MaskKind, Strides};
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
        features: crate::executor::Features::none(),
        notes: vec![
            "float64 arithmetic on the host; inputs decoded from fp16/bf16/fp32/fp64 exactly".into(),
            "outputs rounded once to the problem dtype (LSE to fp32; fp64 for fp64 problems through forward_strided_lse)".into(),
            "fp32/fp64 through the strided-pointer API (forward_strided/backward_strided); host tensors are fp16/bf16".into(),
            format!("refuses b*h_q*s_q*s_kv > {MAX_SCORE_ELEMENTS} (CPU time)"),
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

/// Gather `[s, d]` of head `(b, h)` from a strided buffer.
fn gather(x: &[f64], st: &Strides, b: usize, h: usize, s: usize, d: usize) -> Vec<f64> {
    let mut out = vec![0.0; s * d];
    for i in 0..s {
        let o = st.offset(b, h, i, 0);
        out[i * d..(i + 1) * d].copy_from_slice(&x[o..o + d]);
    }
    out
}

fn scatter(dst: &mut [f64], src: &[f64], st: &Strides, b: usize, h: usize, s: usize, d: usize) {
    for i in 0..s {
        let o = st.offset(b, h, i, 0);
        dst[o..o + d].copy_from_slice(&src[i * d..(i + 1) * d]);
    }
}

/// Per-head forward: returns (P as [sq, skv] probabilities, O [sq, dv], lse [sq]).
#[allow(clippy::type_complexity)]
fn head_forward(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    rd: Rounding,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (sq, skv, dqk, dv) = (p.seqlen_q, p.seqlen_kv, p.head_dim_qk, p.head_dim_v);
    let m = p.effective_mask();
    let mut probs = vec![0.0; sq * skv];
    let mut o = vec![0.0; sq * dv];
    let mut lse = vec![f64::NEG_INFINITY; sq];
    let mut row = vec![0.0; skv];
    for i in 0..sq {
        let (lo, hi) = m.row_range(i);
        if lo >= hi {
            continue;
        }
        let (lo, hi) = (lo as usize, hi as usize);
        let qi = &q[i * dqk..(i + 1) * dqk];
        let mut mx = f64::NEG_INFINITY;
        for j in lo..hi {
            let kj = &k[j * dqk..(j + 1) * dqk];
            let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            // A low-precision framework stores Q K^T, then the scaled scores.
            let s = rd.r(rd.r(dot) * p.softmax_scale);
            row[j] = s;
            mx = mx.max(s);
        }
        let sum: f64 = (lo..hi).map(|j| (row[j] - mx).exp()).sum();
        lse[i] = mx + sum.ln();
        for j in lo..hi {
            probs[i * skv + j] = rd.r((row[j] - mx).exp() / sum);
        }
        let oi = &mut o[i * dv..(i + 1) * dv];
        for j in lo..hi {
            let pj = probs[i * skv + j];
            let vj = &v[j * dv..(j + 1) * dv];
            for (a, b) in oi.iter_mut().zip(vj) {
                *a += pj * b;
            }
        }
        for a in oi.iter_mut() {
            *a = rd.r(*a);
        }
    }
    (probs, o, lse)
}

fn forward_impl(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    rd: Rounding,
) -> (Vec<f64>, Vec<f64>) {
    let (b, hq, sq, skv, dqk, dv) = (
        p.batch,
        p.heads_q,
        p.seqlen_q,
        p.seqlen_kv,
        p.head_dim_qk,
        p.head_dim_v,
    );
    let ratio = p.group_size();
    let mut o = vec![0.0; p.o_span()];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len()];
    let jobs: Vec<(usize, usize)> = (0..b)
        .flat_map(|bi| (0..hq).map(move |h| (bi, h)))
        .collect();
    let results = parallel_map(&jobs, |&(bi, h)| {
        let g = h / ratio;
        let qh = gather(q, &p.layout.q, bi, h, sq, dqk);
        let kh = gather(k, &p.layout.k, bi, g, skv, dqk);
        let vh = gather(v, &p.layout.v, bi, g, skv, dv);
        let (_, oh, lh) = head_forward(p, &qh, &kh, &vh, rd);
        (oh, lh)
    });
    for (&(bi, h), (oh, lh)) in jobs.iter().zip(results) {
        scatter(&mut o, &oh, &p.layout.o, bi, h, sq, dv);
        lse[(bi * hq + h) * sq..(bi * hq + h + 1) * sq].copy_from_slice(&lh);
    }
    (o, lse)
}

#[allow(clippy::type_complexity)]
fn backward_impl(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    rd: Rounding,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, hkv, sq, skv, dqk, dv) = (
        p.batch,
        p.heads_kv,
        p.seqlen_q,
        p.seqlen_kv,
        p.head_dim_qk,
        p.head_dim_v,
    );
    let ratio = p.group_size();
    let scale = p.softmax_scale;
    let jobs: Vec<(usize, usize)> = (0..b)
        .flat_map(|bi| (0..hkv).map(move |g| (bi, g)))
        .collect();
    let results = parallel_map(&jobs, |&(bi, g)| {
        let kh = gather(k, &p.layout.k, bi, g, skv, dqk);
        let vh = gather(v, &p.layout.v, bi, g, skv, dv);
        let mut dk = vec![0.0; skv * dqk];
        let mut dvv = vec![0.0; skv * dv];
        let mut dqs = Vec::with_capacity(ratio);
        for r in 0..ratio {
            let h = g * ratio + r;
            let qh = gather(q, &p.layout.q, bi, h, sq, dqk);
            let doh = gather(d_o, &p.layout.o, bi, h, sq, dv);
            let (probs, oh, _) = head_forward(p, &qh, &kh, &vh, rd);
            let mut dq = vec![0.0; sq * dqk];
            let mut ds_row = vec![0.0; skv];
            for i in 0..sq {
                let doi = &doh[i * dv..(i + 1) * dv];
                // D = rowsum(dO * O); equals rowsum(P * dP) in exact arithmetic.
                let dsum: f64 = doi
                    .iter()
                    .zip(&oh[i * dv..(i + 1) * dv])
                    .map(|(a, b)| a * b)
                    .sum();
                for j in 0..skv {
                    let pij = probs[i * skv + j];
                    if pij == 0.0 {
                        ds_row[j] = 0.0;
                        continue;
                    }
                    let vj = &vh[j * dv..(j + 1) * dv];
                    let dp = rd.r(doi.iter().zip(vj).map(|(a, b)| a * b).sum::<f64>());
                    ds_row[j] = rd.r(pij * (dp - dsum));
                    for (a, b) in dvv[j * dv..(j + 1) * dv].iter_mut().zip(doi) {
                        *a += pij * b;
                    }
                }
                let qi = &qh[i * dqk..(i + 1) * dqk];
                let dqi = &mut dq[i * dqk..(i + 1) * dqk];
                for j in 0..skv {
                    let ds = ds_row[j];
                    if ds == 0.0 {
                        continue;
                    }
                    let kj = &kh[j * dqk..(j + 1) * dqk];
                    for (a, b) in dqi.iter_mut().zip(kj) {
                        *a += ds * b;
                    }
                    for (a, b) in dk[j * dqk..(j + 1) * dqk].iter_mut().zip(qi) {
                        *a += ds * b;
                    }
                }
                for a in dqi.iter_mut() {
                    *a = rd.r(*a * scale);
                }
            }
            dqs.push(dq);
        }
        for a in dk.iter_mut() {
            *a = rd.r(*a * scale);
        }
        for a in dvv.iter_mut() {
            *a = rd.r(*a);
        }
        (dqs, dk, dvv)
    });
    scatter_group_grads(p, &jobs, results)
}

/// One (batch, KV group) job's gradients: dQ of each query head in the group, then dK and dV.
type GroupGrads = (Vec<Vec<f64>>, Vec<f64>, Vec<f64>);

/// Writes every job's gradients into full-size dQ, dK, dV in the problem's strides (shared by
/// both backward passes: they differ in the math, not in where the results go).
fn scatter_group_grads(
    p: &AttentionProblem,
    jobs: &[(usize, usize)],
    results: Vec<GroupGrads>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (sq, skv, dqk, dv) = (p.seqlen_q, p.seqlen_kv, p.head_dim_qk, p.head_dim_v);
    let ratio = p.group_size();
    let mut dq = vec![0.0; p.q_span()];
    let mut dk = vec![0.0; p.k_span()];
    let mut dvo = vec![0.0; p.v_span()];
    for (&(bi, g), (dqs, dkh, dvh)) in jobs.iter().zip(results) {
        for (r, dqh) in dqs.iter().enumerate() {
            scatter(&mut dq, dqh, &p.layout.q, bi, g * ratio + r, sq, dqk);
        }
        scatter(&mut dk, &dkh, &p.layout.k, bi, g, skv, dqk);
        scatter(&mut dvo, &dvh, &p.layout.v, bi, g, skv, dv);
    }
    (dq, dk, dvo)
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

/// Exact float64 forward on strided f64 buffers (Q/K/V/O strides from the problem).
/// Returns `(O, LSE)`; LSE natural log, `-inf` for rows with no admissible key.
pub fn forward_f64(p: &AttentionProblem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    forward_impl(p, q, k, v, Rounding::Exact)
}

/// Exact float64 backward: `(dQ, dK, dV)` for upstream gradient `d_o` (strides of O).
pub fn backward_f64(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    backward_impl(p, q, k, v, d_o, Rounding::Exact)
}

/// Exact float64 backward from the forward's statistics, as the GPU executors compute it:
/// `P = exp(scale * Q K^T - LSE)` on admissible keys and `D = rowsum(dO * O)` with the given `o`
/// (strides of O) and `lse` (`[b, h_q, s_q]`, natural log). With the call's own O and LSE this is
/// [`backward_f64`]; with the O and LSE of a larger softmax that this call is one key block of
/// (a context-parallel ring step), it is that softmax's gradient restricted to the block, which a
/// recomputing backward cannot give. Rows whose LSE is `-inf` contribute nothing.
pub fn backward_f64_from_stats(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, hkv, sq, dqk, dv) = (p.batch, p.heads_kv, p.seqlen_q, p.head_dim_qk, p.head_dim_v);
    let (hq, ratio, scale) = (p.heads_q, p.group_size(), p.softmax_scale);
    let m = p.effective_mask();
    let jobs: Vec<(usize, usize)> = (0..b)
        .flat_map(|bi| (0..hkv).map(move |g| (bi, g)))
        .collect();
    let results = parallel_map(&jobs, |&(bi, g)| {
        let skv = p.seqlen_kv;
        let kh = gather(k, &p.layout.k, bi, g, skv, dqk);
        let vh = gather(v, &p.layout.v, bi, g, skv, dv);
        let mut dk = vec![0.0; skv * dqk];
        let mut dvv = vec![0.0; skv * dv];
        let mut dqs = Vec::with_capacity(ratio);
        for r in 0..ratio {
            let h = g * ratio + r;
            let qh = gather(q, &p.layout.q, bi, h, sq, dqk);
            let oh = gather(o, &p.layout.o, bi, h, sq, dv);
            let doh = gather(d_o, &p.layout.o, bi, h, sq, dv);
            let lh = &lse[(bi * hq + h) * sq..(bi * hq + h + 1) * sq];
            let mut dq = vec![0.0; sq * dqk];
            for i in 0..sq {
                let (lo, hi) = m.row_range(i);
                if lo >= hi || lh[i] == f64::NEG_INFINITY {
                    continue;
                }
                let qi = &qh[i * dqk..(i + 1) * dqk];
                let doi = &doh[i * dv..(i + 1) * dv];
                let dsum: f64 = doi
                    .iter()
                    .zip(&oh[i * dv..(i + 1) * dv])
                    .map(|(a, b)| a * b)
                    .sum();
                let dqi = &mut dq[i * dqk..(i + 1) * dqk];
                for j in lo as usize..hi as usize {
                    let kj = &kh[j * dqk..(j + 1) * dqk];
                    let vj = &vh[j * dv..(j + 1) * dv];
                    let s: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale;
                    let pij = (s - lh[i]).exp();
                    let dp: f64 = doi.iter().zip(vj).map(|(a, b)| a * b).sum();
                    let ds = pij * (dp - dsum);
                    for (a, b) in dvv[j * dv..(j + 1) * dv].iter_mut().zip(doi) {
                        *a += pij * b;
                    }
                    for (a, b) in dqi.iter_mut().zip(kj) {
                        *a += ds * b;
                    }
                    for (a, b) in dk[j * dqk..(j + 1) * dqk].iter_mut().zip(qi) {
                        *a += ds * b;
                    }
                }
                for a in dqi.iter_mut() {
                    *a *= scale;
                }
            }
            dqs.push(dq);
        }
        for a in dk.iter_mut() {
            *a *= scale;
        }
        (dqs, dk, dvv)
    });
    scatter_group_grads(p, &jobs, results)
}

/// Textbook attention with every stored intermediate (scores, probabilities, dP, dS, outputs)
/// rounded to `p.dtype`: the "naive same-dtype" baseline. Returns `(O, LSE)`.
pub fn naive_forward(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    forward_impl(p, q, k, v, Rounding::Dtype(p.dtype))
}

/// Backward of [`naive_forward`], same rounding. Returns `(dQ, dK, dV)`.
pub fn naive_backward(
    p: &AttentionProblem,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    backward_impl(p, q, k, v, d_o, Rounding::Dtype(p.dtype))
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
/// rounded once to `p.dtype`) and LSE (`[b, h_q, s_q]` contiguous fp32, natural log, `-inf`
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

/// Where a strided call writes LSE (`[b, h_q, s_q]`, contiguous, natural log).
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
    manifest().admits(p)?;
    let lse_null = match lse {
        LseOut::F32(x) => x.is_null(),
        LseOut::F64(x) => x.is_null(),
    };
    if [q, k, v].iter().any(|x| x.is_null()) || o.is_null() || lse_null {
        return Err(ExecError::invalid("null pointer"));
    }
    let (b, hq, hkv) = (p.batch, p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dv) = (p.seqlen_q, p.seqlen_kv, p.head_dim_qk, p.head_dim_v);
    // SAFETY: per the contract.
    let (qc, kc, vc) = unsafe {
        (
            gather_raw(q, p.dtype, &p.layout.q, (b, hq, sq, dqk)),
            gather_raw(k, p.dtype, &p.layout.k, (b, hkv, skv, dqk)),
            gather_raw(v, p.dtype, &p.layout.v, (b, hkv, skv, dv)),
        )
    };
    let c = compact(p);
    let (oc, lc) = forward_f64(&c, &qc, &kc, &vc);
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
    let (b, hq, hkv) = (p.batch, p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dvd) = (p.seqlen_q, p.seqlen_kv, p.head_dim_qk, p.head_dim_v);
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
    let (gq, gk, gv) = backward_f64(&c, &qc, &kc, &vc, &doc);
    // SAFETY: per the contract.
    unsafe {
        scatter_raw(dq, p.dtype, &p.layout.q, (b, hq, sq, dqk), &gq);
        scatter_raw(dk, p.dtype, &p.layout.k, (b, hkv, skv, dqk), &gk);
        scatter_raw(dv, p.dtype, &p.layout.v, (b, hkv, skv, dvd), &gv);
    }
    Ok(())
}

/// Backward on host memory of any strides and dtype from the forward's statistics (see
/// [`backward_f64_from_stats`]): reads O (strides of O) and LSE (`[b, h_q, s_q]` contiguous,
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
    let (b, hq, hkv) = (p.batch, p.heads_q, p.heads_kv);
    let (sq, skv, dqk, dvd) = (p.seqlen_q, p.seqlen_kv, p.head_dim_qk, p.head_dim_v);
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
    let (gq, gk, gv) = backward_f64_from_stats(&c, &qc, &kc, &vc, &oc, &lc, &doc);
    // SAFETY: per the contract.
    unsafe {
        scatter_raw(dq, p.dtype, &p.layout.q, (b, hq, sq, dqk), &gq);
        scatter_raw(dk, p.dtype, &p.layout.k, (b, hkv, skv, dqk), &gk);
        scatter_raw(dv, p.dtype, &p.layout.v, (b, hkv, skv, dvd), &gv);
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

    /// Runs on host memory of any strides and dtype, synchronously: [`forward_strided_lse`] /
    /// [`backward_strided_from_stats`], the LSE fp64 for fp64 problems and fp32 otherwise.
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
                    forward_strided_lse(
                        p,
                        a.q as *const u8,
                        a.k as *const u8,
                        a.v as *const u8,
                        a.o as *mut u8,
                        lse,
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
                    backward_strided_from_stats(
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
                let t = Instant::now();
                let (o, lse) = forward_f64(p, &q, &k, &v);
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
                let t = Instant::now();
                let (dq, dk, dv) = backward_f64(p, &q, &k, &v, &d_o);
                let ms = t.elapsed().as_secs_f64() * 1e3;
                Ok(HostOutput::Backward(BackwardOutput {
                    dq: encode(p.dtype, &dq),
                    dk: encode(p.dtype, &dk),
                    dv: encode(p.dtype, &dv),
                    stats: host_stats(ms),
                    d_sink: Vec::new(),
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
