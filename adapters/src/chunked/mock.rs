//! CPU implementation of the chunked algorithm's device operations over a byte arena, with
//! cuBLAS's column-major semantics and argument checks. It tests the orchestration (chunk
//! ranges, strides, GEMM mapping, masking, accumulation) against the float64 reference on
//! machines without a GPU. The CUDA kernels themselves are tested on the GPU.

use super::ChunkedConfig;
use super::plan::{
    self, BwdArgs, BwdScoresArgs, CastArgs, CublasGemm, Elem, FillF32Args, Ops, PlanKind,
    RowDotArgs, SinkArg, SinkGradArgs, SoftmaxArgs, ZeroRowsArgs,
};
use crate::executor::{DeviceBackwardArgs, DeviceForwardArgs, ExecError, HostTensor};
use crate::problem::{AttentionProblem, DType};

struct Mock {
    mem: Vec<u8>,
    dtype: DType,
    launches: usize,
    /// fp32 elements written by `fill_f32` (the backward's accumulator zeroing among them).
    filled: usize,
    /// Multiply-adds of every GEMM (`m n k batch`): the work a plan asks of cuBLAS.
    macs: usize,
    /// GEMM calls (launches of cuBLAS kernels).
    gemms: usize,
    /// The problem and tensors of a fused-score backward (what the fused executor's score
    /// kernel reads through its TMA maps).
    scores_of: Option<(AttentionProblem, DeviceBackwardArgs)>,
}

impl Mock {
    fn alloc(&mut self, bytes: u64) -> u64 {
        let at = (self.mem.len() as u64).div_ceil(256) * 256 + 256;
        self.mem.resize((at + bytes) as usize, 0xFF);
        at
    }
    fn get(&self, addr: u64, e: Elem) -> f64 {
        let a = addr as usize;
        match e {
            Elem::F32 => f32::from_le_bytes(self.mem[a..a + 4].try_into().unwrap()) as f64,
            Elem::Low => self
                .dtype
                .from_bits(u16::from_le_bytes([self.mem[a], self.mem[a + 1]])),
        }
    }
    fn set(&mut self, addr: u64, e: Elem, v: f64) {
        let a = addr as usize;
        match e {
            Elem::F32 => self.mem[a..a + 4].copy_from_slice(&(v as f32).to_le_bytes()),
            Elem::Low => self.mem[a..a + 2].copy_from_slice(&self.dtype.to_bits(v).to_le_bytes()),
        }
    }
    fn put_tensor(&mut self, t: &HostTensor) -> u64 {
        let a = self.alloc(2 * t.data.len() as u64);
        for (i, &x) in t.data.iter().enumerate() {
            let o = a as usize + 2 * i;
            self.mem[o..o + 2].copy_from_slice(&x.to_le_bytes());
        }
        a
    }
    fn take_tensor(&self, a: u64, len: usize) -> HostTensor {
        HostTensor {
            dtype: self.dtype,
            data: (0..len)
                .map(|i| {
                    let o = a as usize + 2 * i;
                    u16::from_le_bytes([self.mem[o], self.mem[o + 1]])
                })
                .collect(),
        }
    }
    fn row_range(a_i0: usize, m: &crate::problem::EffectiveMask, row: usize) -> (i64, i64) {
        m.row_range(a_i0 + row)
    }
    /// A raw score in natural units as the kernels compute it in fp32: `scale x`, or
    /// `c tanh(scale x / c)` soft-capped; with `t = tanh(..)` (0 without capping).
    fn score(x: f32, scale: f32, softcap: Option<f32>) -> (f32, f32) {
        match softcap {
            Some(c) => {
                let t = (x * (scale / c)).tanh();
                (c * t, t)
            }
            None => (x * scale, 0.0),
        }
    }
    /// Element `at` of P and dS: `P = exp(score(S) - lse)`, `dS = P (dP - D)` (times `1 - t^2`
    /// soft-capped) from the fp32 scores `(S, dP)` of an admitted key, zeros for a masked one
    /// (`None`). `stats` is `(scale, softcap, lse, D)`. Shared by `bwd_elementwise` and
    /// `bwd_scores`.
    fn store_p_ds(
        &mut self,
        p: u64,
        ds: u64,
        at: usize,
        scores: Option<(f32, f32)>,
        (scale, softcap, lse, d): (f32, Option<f32>, f32, f32),
    ) {
        let (pv, dsv) = scores.map_or((0.0, 0.0), |(s, dp)| {
            let (x, t) = Mock::score(s, scale, softcap);
            let pv = (x - lse).exp();
            let dsv = pv * (dp - d);
            (
                pv,
                if softcap.is_some() {
                    dsv * (1.0 - t * t)
                } else {
                    dsv
                },
            )
        });
        self.set(p + 2 * at as u64, Elem::Low, pv as f64);
        self.set(ds + 2 * at as u64, Elem::Low, dsv as f64);
    }
}

impl Ops for Mock {
    fn gemm(&mut self, g: &CublasGemm) -> Result<(), ExecError> {
        self.launches += 1;
        self.macs += g.m * g.n * g.k * g.batch;
        self.gemms += 1;
        // cuBLAS argument rules.
        let (ra, rb) = (
            if g.trans_a { g.k } else { g.m },
            if g.trans_b { g.n } else { g.k },
        );
        if g.lda < ra.max(1) || g.ldb < rb.max(1) || g.ldc < g.m.max(1) {
            return Err(ExecError::Backend {
                library: "cublas",
                message: format!("invalid leading dimension in {g:?}"),
            });
        }
        for bt in 0..g.batch {
            let (a, b, c) = (
                g.a + 2 * (bt * g.stride_a) as u64,
                g.b + 2 * (bt * g.stride_b) as u64,
                g.c + g.c_elem.bytes() * (bt * g.stride_c) as u64,
            );
            for j in 0..g.n {
                for i in 0..g.m {
                    let mut acc = 0.0f64;
                    for l in 0..g.k {
                        let ai = if g.trans_a {
                            l + i * g.lda
                        } else {
                            i + l * g.lda
                        };
                        let bi = if g.trans_b {
                            j + l * g.ldb
                        } else {
                            l + j * g.ldb
                        };
                        acc += self.get(a + 2 * ai as u64, Elem::Low)
                            * self.get(b + 2 * bi as u64, Elem::Low);
                    }
                    let ca = c + g.c_elem.bytes() * (i + j * g.ldc) as u64;
                    let old = if g.beta != 0.0 {
                        self.get(ca, g.c_elem)
                    } else {
                        0.0
                    };
                    self.set(ca, g.c_elem, g.alpha as f64 * acc + g.beta as f64 * old);
                }
            }
        }
        Ok(())
    }

    fn softmax_fwd(&mut self, a: &SoftmaxArgs) -> Result<(), ExecError> {
        self.launches += 1;
        let l2e = std::f32::consts::LOG2_E;
        for r in 0..a.heads {
            for i in 0..a.rows {
                let row = (r * a.rows + i) * a.lds;
                let (lo, hi) = Mock::row_range(a.i0, &a.mask, i);
                let lo = (lo - a.kv_lo as i64).max(0) as usize;
                let hi = (hi - a.kv_lo as i64).clamp(0, a.n as i64) as usize;
                let xs: Vec<f32> = (lo..hi)
                    .map(|c| {
                        let s = self.get(a.s + 4 * (row + c) as u64, Elem::F32) as f32;
                        Mock::score(s, a.scale, a.softcap).0 * l2e
                    })
                    .collect();
                // The sink joins non-empty rows only (an empty row stays LSE = -inf).
                let sink = match a.sink {
                    SinkArg::None => None,
                    SinkArg::Zero => Some(0.0),
                    SinkArg::Logits(ptr) => Some(self.get(ptr + 4 * r as u64, Elem::F32) as f32),
                }
                .filter(|_| lo < hi)
                .map(|s| s * l2e);
                let mx = xs
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = xs.iter().chain(&sink).map(|x| (x - mx).exp2()).sum();
                for c in 0..a.lds {
                    let v = if c >= lo && c < hi {
                        (xs[c - lo] - mx).exp2() / sum
                    } else {
                        0.0
                    };
                    self.set(a.p + 2 * (row + c) as u64, Elem::Low, v as f64);
                }
                let lse = if lo < hi {
                    (mx + sum.log2()) * std::f32::consts::LN_2
                } else {
                    f32::NEG_INFINITY
                };
                self.set(
                    a.lse + 4 * (r * a.lse_head_stride + i) as u64,
                    Elem::F32,
                    lse as f64,
                );
            }
        }
        Ok(())
    }

    fn bwd_elementwise(&mut self, a: &BwdArgs) -> Result<(), ExecError> {
        self.launches += 1;
        for r in 0..a.heads {
            for i in 0..a.rows {
                let row = (r * a.rows + i) * a.lds;
                let (lo, hi) = Mock::row_range(a.i0, &a.mask, i);
                let lo = (lo - a.kv_lo as i64).max(0) as usize;
                let hi = (hi - a.kv_lo as i64).clamp(0, a.n as i64) as usize;
                let lse = self.get(a.lse + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                let d = self.get(a.dvec + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                for c in 0..a.lds {
                    let scores = (c >= lo && c < hi).then(|| {
                        (
                            self.get(a.s + 4 * (row + c) as u64, Elem::F32) as f32,
                            self.get(a.dp + 4 * (row + c) as u64, Elem::F32) as f32,
                        )
                    });
                    self.store_p_ds(a.p, a.ds, row + c, scores, (a.scale, a.softcap, lse, d));
                }
            }
        }
        Ok(())
    }

    fn row_dot(&mut self, a: &RowDotArgs) -> Result<(), ExecError> {
        self.launches += 1;
        for b in 0..a.batch {
            for h in 0..a.heads {
                for s in 0..a.seqlen {
                    let base = (b * a.stride_b + h * a.stride_h + s * a.stride_s) as u64;
                    let dot: f64 = (0..a.dim as u64)
                        .map(|d| {
                            self.get(a.o + 2 * (base + d), Elem::Low)
                                * self.get(a.d_o + 2 * (base + d), Elem::Low)
                        })
                        .sum();
                    let idx = ((b * a.heads + h) * a.seqlen + s) as u64;
                    self.set(a.out + 4 * idx, Elem::F32, dot);
                }
            }
        }
        Ok(())
    }

    fn cast_rows(&mut self, a: &CastArgs) -> Result<(), ExecError> {
        self.launches += 1;
        for r in 0..a.rows {
            for c in 0..a.cols {
                let v = self.get(a.src + 4 * (r * a.cols + c) as u64, Elem::F32);
                self.set(a.dst + 2 * (r * a.dst_ld + c) as u64, Elem::Low, v);
            }
        }
        Ok(())
    }

    fn zero_rows(&mut self, a: &ZeroRowsArgs) -> Result<(), ExecError> {
        self.launches += 1;
        for h in 0..a.heads {
            for r in 0..a.rows {
                for c in 0..a.cols {
                    let o = h * a.head_stride + r * a.row_stride + c;
                    self.set(a.dst + 2 * o as u64, Elem::Low, 0.0);
                }
            }
        }
        Ok(())
    }

    fn fill_f32(&mut self, a: &FillF32Args) -> Result<(), ExecError> {
        self.launches += 1;
        self.filled += a.rows * a.cols;
        for r in 0..a.rows {
            for c in 0..a.cols {
                self.set(a.dst + 4 * (r * a.ld + c) as u64, Elem::F32, a.value as f64);
            }
        }
        Ok(())
    }

    /// fp32 sums as the kernel's (rows with a finite LSE and a non-zero D), overwriting.
    fn sink_grad(&mut self, a: &SinkGradArgs) -> Result<(), ExecError> {
        self.launches += 1;
        for h in 0..a.heads {
            let s = self.get(a.sink + 4 * h as u64, Elem::F32) as f32;
            let mut acc = 0.0f32;
            for b in 0..a.batch {
                for i in 0..a.rows {
                    let at = 4 * ((b * a.heads + h) * a.rows + i) as u64;
                    let (l, d) = (
                        self.get(a.lse + at, Elem::F32) as f32,
                        self.get(a.dvec + at, Elem::F32) as f32,
                    );
                    if l != f32::NEG_INFINITY && d != 0.0 {
                        acc += (s - l).exp() * d;
                    }
                }
            }
            self.set(a.d_sink + 4 * h as u64, Elem::F32, -acc as f64);
        }
        Ok(())
    }

    /// What the fused score kernel computes: S and dP with fp32 results, then P and dS as in
    /// `bwd_elementwise`, every column up to `lds`.
    fn bwd_scores(&mut self, a: &BwdScoresArgs) -> Result<(), ExecError> {
        self.launches += 1;
        let (p, io) = self
            .scores_of
            .clone()
            .ok_or_else(|| ExecError::Unsupported {
                reason: "mock: no problem for bwd_scores".into(),
            })?;
        let (m, scale) = (a.mask, p.softmax_scale as f32);
        let (lq, lk, lv, lo) = (p.layout.q, p.layout.k, p.layout.v, p.layout.o);
        let dot = |mm: &Mock, x: u64, y: u64, dim: usize| -> f32 {
            (0..dim as u64)
                .map(|d| mm.get(x + 2 * d, Elem::Low) * mm.get(y + 2 * d, Elem::Low))
                .sum::<f64>() as f32
        };
        for r in 0..a.heads {
            let h = a.h0 + r;
            for i in 0..a.rows {
                let row = (r * a.rows + i) * a.lds;
                let (lo_k, hi_k) = m.row_range(a.i0 + i - a.seq_q0);
                let lse = self.get(a.lse + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                let d = self.get(a.dvec + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                let q = io.q + 2 * lq.offset(a.batch, h, a.i0 + i, 0) as u64;
                let d_o = io.d_o + 2 * lo.offset(a.batch, h, a.i0 + i, 0) as u64;
                for c in 0..a.lds {
                    let key = a.kv_lo + c;
                    let local = key as i64 - a.seq_kv0 as i64;
                    let scores = (local >= lo_k && local < hi_k).then(|| {
                        let k = io.k + 2 * lk.offset(a.batch, a.kv_head, key, 0) as u64;
                        let v = io.v + 2 * lv.offset(a.batch, a.kv_head, key, 0) as u64;
                        (
                            dot(self, q, k, p.head_dim_qk),
                            dot(self, d_o, v, p.head_dim_v),
                        )
                    });
                    self.store_p_ds(a.p, a.ds, row + c, scores, (scale, a.softcap, lse, d));
                }
            }
        }
        Ok(())
    }
}

/// What [`run_mock`] returns: forward O and LSE, backward dQ, dK, dV and d_sink.
struct MockOut {
    o: HostTensor,
    lse: Vec<f32>,
    dq: HostTensor,
    dk: HostTensor,
    dv: HostTensor,
    d_sink: Vec<f32>,
    /// fp32 elements the backward filled (`Mock::filled` after the forward's).
    bwd_filled: usize,
    /// GEMM multiply-adds and GEMM calls of the backward.
    bwd_macs: usize,
    bwd_gemms: usize,
}

/// Chunked forward + backward on the CPU mock. Every output buffer starts as garbage (0xFF
/// bytes: NaN in every dtype) so unwritten elements are caught.
fn run_mock(
    p: &AttentionProblem,
    cfg: &ChunkedConfig,
    backward: PlanKind,
    inp: &crate::trial::RandomInputs,
    sink: &[f32],
) -> MockOut {
    let mut m = Mock {
        mem: Vec::new(),
        dtype: p.dtype,
        launches: 0,
        filled: 0,
        macs: 0,
        gemms: 0,
        scores_of: None,
    };
    let (qa, ka, va, doa) = (
        m.put_tensor(&inp.q),
        m.put_tensor(&inp.k),
        m.put_tensor(&inp.v),
        m.put_tensor(&inp.d_o),
    );
    let oa = m.alloc(2 * p.o_span() as u64);
    let lsea = m.alloc(4 * p.lse_len() as u64);
    let (sink_a, d_sink_a) = if sink.is_empty() {
        (0, 0)
    } else {
        let (a, d) = (
            m.alloc(4 * sink.len() as u64),
            m.alloc(4 * sink.len() as u64),
        );
        for (i, &x) in sink.iter().enumerate() {
            m.set(a + 4 * i as u64, Elem::F32, x as f64);
            m.set(d + 4 * i as u64, Elem::F32, f64::NAN);
        }
        (a, d)
    };
    let fplan = plan::make_plan(p, cfg, PlanKind::Forward).unwrap();
    let ws = m.alloc(fplan.bytes);
    let fio = DeviceForwardArgs {
        q: qa,
        k: ka,
        v: va,
        o: oa,
        lse: lsea,
        sink: sink_a,
    };
    plan::forward(&mut m, p, &fplan, &fio, ws).unwrap();
    let bplan = plan::make_plan(p, cfg, backward).unwrap();
    let ws = m.alloc(bplan.bytes);
    let (dqa, dka, dva) = (
        m.alloc(2 * p.q_span() as u64),
        m.alloc(2 * p.k_span() as u64),
        m.alloc(2 * p.v_span() as u64),
    );
    let bio = DeviceBackwardArgs {
        q: qa,
        k: ka,
        v: va,
        o: oa,
        d_o: doa,
        lse: lsea,
        dq: dqa,
        dk: dka,
        dv: dva,
        sink: sink_a,
        d_sink: d_sink_a,
    };
    m.scores_of = Some((p.clone(), bio));
    let (filled_before, macs_before, gemms_before) = (m.filled, m.macs, m.gemms);
    plan::backward(&mut m, p, &bplan, &bio, ws).unwrap();
    let f32s = |m: &Mock, a: u64, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| m.get(a + 4 * i as u64, Elem::F32) as f32)
            .collect()
    };
    MockOut {
        o: m.take_tensor(oa, p.o_span()),
        lse: f32s(&m, lsea, p.lse_len()),
        dq: m.take_tensor(dqa, p.q_span()),
        dk: m.take_tensor(dka, p.k_span()),
        dv: m.take_tensor(dva, p.v_span()),
        d_sink: if sink.is_empty() {
            Vec::new()
        } else {
            f32s(&m, d_sink_a, sink.len())
        },
        bwd_filled: m.filled - filled_before,
        bwd_macs: m.macs - macs_before,
        bwd_gemms: m.gemms - gemms_before,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{
        DiagonalAlignment, LayoutKind, MaskSpec, SeqLens, SeqPacking, SoftmaxKind, Strides,
    };
    use crate::trial::{random_inputs, verify};

    use super::super::test_oracle as oracle;

    fn cfg(chunk: usize) -> ChunkedConfig {
        ChunkedConfig {
            max_chunk_rows: chunk,
            min_chunk_rows: 1,
            target_rows_per_gemm: chunk,
            workspace_budget: 1 << 30,
            fused_score_lanes: 2,
            bwd_row_blocks: 2,
        }
    }

    /// Both backward plans against the reference; per plan, the fp32 elements its backward filled.
    fn check(p: &AttentionProblem, chunk: usize, seed: u64) -> Vec<(PlanKind, usize)> {
        let inp = random_inputs(p, seed);
        // Both backward plans: fp32 scores through GEMMs, and P/dS from the fused executor's
        // score kernel (as the mock computes it).
        let mut filled = Vec::new();
        for kind in [PlanKind::Backward, PlanKind::BackwardFusedScores] {
            let r = run_mock(p, &cfg(chunk), kind, &inp, &[]);
            filled.push((kind, r.bwd_filled));
            let v = verify_mock(p, &inp, r);
            assert!(v.passed, "{p:?} chunk {chunk} {kind:?}: {v:#?}");
        }
        filled
    }

    /// A mock run's outputs against the reference (`trial::verify`).
    fn verify_mock(
        p: &AttentionProblem,
        inp: &crate::trial::RandomInputs,
        r: MockOut,
    ) -> crate::trial::Verification {
        let bwd = crate::executor::BackwardOutput {
            dq: r.dq,
            dk: r.dk,
            dv: r.dv,
            stats: Default::default(),
            d_sink: Vec::new(),
        };
        verify(p, inp, &r.o, &r.lse, Some(&bwd))
    }

    /// The features' check: both backward plans against the test oracle (FlashAttention
    /// criterion for O, dQ, dK, dV, d_sink; LSE to 1e-5 with -inf exactly in padding and fully
    /// masked rows), outputs written everywhere (they start as garbage); returns d_sink.
    fn check_features(p: &AttentionProblem, chunk: usize, seed: u64) -> Vec<f32> {
        let inp = random_inputs(p, seed);
        // A learnable problem's random logits (else none).
        let sink = inp.sink.clone().unwrap_or_default();
        let mut d_sinks = Vec::new();
        for kind in [PlanKind::Backward, PlanKind::BackwardFusedScores] {
            let r = run_mock(p, &cfg(chunk), kind, &inp, &sink);
            let (checks, passed) = oracle::oracle_verify(
                p,
                [&inp.q, &inp.k, &inp.v, &inp.d_o],
                &sink,
                &r.o,
                &r.lse,
                Some((&r.dq, &r.dk, &r.dv, &r.d_sink)),
            );
            assert!(passed, "{p:?} chunk {chunk} {kind:?}: {checks:#?}");
            assert_eq!(r.d_sink.len(), p.sink_len());
            d_sinks.push(r.d_sink);
        }
        // Same sums in the same order whichever plan made dS.
        assert_eq!(d_sinks[0], d_sinks[1]);
        d_sinks.swap_remove(0)
    }

    fn seqlens(packing: SeqPacking) -> SeqLens {
        // Batch of 3: a full-length sequence, a short one, and one without query rows (its
        // keys still get dK = dV = 0).
        match packing {
            SeqPacking::Packed => {
                SeqLens::from_cu_seqlens(&[0, 13, 18, 18], &[0, 9, 20, 24]).unwrap()
            }
            side => SeqLens::padded(side, vec![13, 5, 0], vec![9, 11, 4]),
        }
    }

    #[test]
    fn mock_serves_softcap_and_sinks() {
        let mut seed = 100;
        let masks = [
            MaskSpec::NONE,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec::window(3, 2, DiagonalAlignment::TopLeft),
        ];
        for softcap in [None, Some(2.5)] {
            for softmax in [
                SoftmaxKind::Vanilla,
                SoftmaxKind::OffByOne,
                SoftmaxKind::Learnable,
            ] {
                for mask in masks {
                    for dtype in [DType::BF16, DType::F16] {
                        let mut p =
                            AttentionProblem::new(2, 4, 2, 11, 14, 16, 8, dtype).with_mask(mask);
                        p.softcap = softcap;
                        p.softmax = softmax;
                        // Larger scores so the cap bites (tanh well away from linear).
                        p.softmax_scale = 0.6;
                        seed += 1;
                        check_features(&p, 4, seed);
                    }
                }
            }
        }
    }

    #[test]
    fn mock_serves_padded_and_packed_sequences() {
        let mut seed = 200;
        let masks = [
            MaskSpec::NONE,
            MaskSpec::CAUSAL_TOP_LEFT,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec::window(4, 1, DiagonalAlignment::BottomRight),
        ];
        for packing in [
            SeqPacking::PaddedRight,
            SeqPacking::PaddedLeft,
            SeqPacking::Packed,
        ] {
            for mask in masks {
                for layout in [LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd] {
                    let p = AttentionProblem::new(3, 4, 2, 13, 11, 16, 8, DType::BF16)
                        .with_mask(mask)
                        .with_seqlens(seqlens(packing), layout);
                    seed += 1;
                    check_features(&p, 4, seed);
                }
                // A sequence with query rows and no keys (its rows are empty: O = 0,
                // LSE = -inf), next to a one-token one.
                let lens = match packing {
                    SeqPacking::Packed => {
                        SeqLens::from_cu_seqlens(&[0, 6, 7, 20], &[0, 0, 1, 12]).unwrap()
                    }
                    side => SeqLens::padded(side, vec![6, 1, 13], vec![0, 1, 11]),
                };
                let mut p = AttentionProblem::new(3, 2, 1, 13, 11, 8, 16, DType::F16)
                    .with_mask(mask)
                    .with_seqlens(lens, LayoutKind::Bshd);
                p.softmax = SoftmaxKind::Learnable;
                seed += 1;
                check_features(&p, 5, seed);
            }
        }
    }

    #[test]
    fn mock_serves_combined_features() {
        // Everything at once: GQA, MQA, d_qk != d_v, softcap, sinks, sequences, windows.
        let mut seed = 300;
        for (hq, hkv, dqk, dv) in [(4, 2, 24, 8), (3, 1, 8, 16), (2, 2, 16, 16)] {
            for packing in [
                SeqPacking::PaddedRight,
                SeqPacking::PaddedLeft,
                SeqPacking::Packed,
            ] {
                for (softmax, softcap) in [
                    (SoftmaxKind::Learnable, Some(1.5)),
                    (SoftmaxKind::OffByOne, Some(4.0)),
                    (SoftmaxKind::Learnable, None),
                ] {
                    for mask in [
                        MaskSpec::CAUSAL_BOTTOM_RIGHT,
                        MaskSpec::window(2, 3, DiagonalAlignment::TopLeft),
                    ] {
                        let mut p = AttentionProblem::new(3, hq, hkv, 13, 11, dqk, dv, DType::F16)
                            .with_mask(mask)
                            .with_seqlens(seqlens(packing), LayoutKind::Bshd);
                        p.softmax = softmax;
                        p.softcap = softcap;
                        seed += 1;
                        for chunk in [3, 64] {
                            check_features(&p, chunk, seed);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn mock_learnable_sink_gradient_is_deterministic_and_overwritten() {
        let mut p = AttentionProblem::new(2, 4, 2, 9, 12, 16, 16, DType::BF16).with_seqlens(
            SeqLens::padded(SeqPacking::PaddedLeft, vec![9, 6], vec![12, 7]),
            LayoutKind::Bshd,
        );
        p.softmax = SoftmaxKind::Learnable;
        let a = check_features(&p, 4, 41);
        let b = check_features(&p, 4, 41);
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert!(a.iter().all(|x| x.is_finite() && *x != 0.0), "{a:?}");
    }

    #[test]
    fn the_gate_admits_the_features_it_serves() {
        for packing in [
            SeqPacking::PaddedRight,
            SeqPacking::PaddedLeft,
            SeqPacking::Packed,
        ] {
            for softmax in [SoftmaxKind::OffByOne, SoftmaxKind::Learnable] {
                let mut p = AttentionProblem::new(3, 4, 2, 13, 11, 16, 8, DType::BF16)
                    .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
                    .with_seqlens(seqlens(packing), LayoutKind::Bshd);
                p.softmax = softmax;
                p.softcap = Some(30.0);
                assert_eq!(super::super::check_problem(&p), Ok(()), "{p:?}");
                // What it cannot do stays refused, features or not.
                p.head_dim_qk = 12;
                assert!(super::super::check_problem(&p).is_err());
            }
        }
    }

    #[test]
    fn mock_refuses_a_learnable_sink_without_logits() {
        let mut p = AttentionProblem::new(1, 2, 1, 8, 8, 16, 16, DType::BF16);
        p.softmax = SoftmaxKind::Learnable;
        let mut m = Mock {
            mem: Vec::new(),
            dtype: p.dtype,
            launches: 0,
            filled: 0,
            macs: 0,
            gemms: 0,
            scores_of: None,
        };
        let plan = plan::make_plan(&p, &cfg(4), PlanKind::Forward).unwrap();
        let ws = m.alloc(plan.bytes);
        let io = DeviceForwardArgs {
            q: 256,
            k: 256,
            v: 256,
            o: 256,
            lse: 256,
            sink: 0,
        };
        let r = plan::forward(&mut m, &p, &plan, &io, ws);
        assert!(matches!(r, Err(ExecError::InvalidInput { .. })), "{r:?}");
        assert_eq!(m.launches, 0);
    }

    #[test]
    fn mock_matches_reference_across_masks_layouts_and_gqa() {
        let masks = [
            MaskSpec::NONE,
            MaskSpec::CAUSAL_TOP_LEFT,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec::window(5, 3, DiagonalAlignment::TopLeft),
            MaskSpec::window(4, 0, DiagonalAlignment::BottomRight),
        ];
        let mut seed = 1;
        for (hq, hkv, sq, skv) in [(4, 2, 19, 19), (2, 2, 13, 22), (3, 1, 24, 9)] {
            for mask in masks {
                for layout in [LayoutKind::Bshd, LayoutKind::Sbhd] {
                    for dtype in [DType::BF16, DType::F16] {
                        let p = AttentionProblem::new(2, hq, hkv, sq, skv, 16, 8, dtype)
                            .with_mask(mask)
                            .with_layout(layout);
                        seed += 1;
                        check(&p, 5, seed);
                    }
                }
            }
        }
    }

    /// The fp32 dK / dV accumulators are written by the first chunk's GEMMs (beta = 0), the last
    /// chunk first: where it reaches every key (causal, no mask) nothing is zeroed, which saves a
    /// pass over both accumulators per (sequence, KV head). A window leaves keys the first chunk
    /// misses: exactly those are zeroed, once.
    #[test]
    fn the_backward_zeroes_only_accumulator_keys_the_first_chunk_misses() {
        let (batch, hq, hkv, s, d) = (2, 4, 2, 40, 8);
        let window = MaskSpec::window(2, 0, DiagonalAlignment::TopLeft);
        for (i, mask) in [
            MaskSpec::NONE,
            MaskSpec::CAUSAL_TOP_LEFT,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            window,
        ]
        .into_iter()
        .enumerate()
        {
            let p = AttentionProblem::new(batch, hq, hkv, s, s, d, d, DType::BF16).with_mask(mask);
            for (kind, filled) in check(&p, 8, 40 + i as u64) {
                // The window's last chunk (rows from `last`) reaches keys last - 2 .. s: the keys
                // below are zeroed, in dK and dV of every (sequence, KV head).
                let rows = plan::make_plan(&p, &cfg(8), kind).unwrap().chunk_rows;
                let last = (s - 1) / rows * rows;
                assert!(last > 2, "the test needs several chunks ({rows} rows each)");
                let want = if mask == window {
                    batch * hkv * (last - 2) * 2 * d
                } else {
                    0
                };
                assert_eq!(filled, want, "{mask:?} {kind:?}, chunks of {rows} rows");
            }
        }
    }

    /// Row blocks: each block's dQ GEMM reads only the keys its rows see, each dK / dV GEMM only
    /// the rows that see its keys. Causal, s = 64, chunks of 32 rows, d = 8 (MACs per GEMM m n k):
    /// - one block: chunk 1 (rows 32..64, keys 0..64) 32x8x64 for dQ and 64x8x32 for each of dK
    ///   and dV; chunk 0 (keys 0..32) 32x8x32 each: 3 x 16384 + 3 x 8192 = 73728;
    /// - two blocks of 16 rows: chunk 1's dQ 16x8x48 + 16x8x64 = 14336, its dK / dV keys 0..48
    ///   over all 32 rows (12288) and keys 48..64 over the last 16 (2048); chunk 0's dQ
    ///   16x8x16 + 16x8x32 = 6144, dK / dV 16x8x32 + 16x8x16 = 6144: 3 x 14336 + 3 x 6144 = 61440.
    ///
    /// Any number of blocks, under every mask, gives the reference's gradients.
    #[test]
    fn row_blocks_skip_the_masked_part_of_each_chunk() {
        let causal = AttentionProblem::new(1, 1, 1, 64, 64, 8, 8, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
        let inp = random_inputs(&causal, 5);
        // GEMM calls per chunk: one block 1 dQ + 2 (dK, dV); two blocks 2 dQ + 2 x 2.
        for (blocks, macs, gemms) in [(1, 73728, 6), (2, 61440, 12)] {
            let cfg = ChunkedConfig {
                bwd_row_blocks: blocks,
                ..cfg(32)
            };
            let r = run_mock(&causal, &cfg, PlanKind::BackwardFusedScores, &inp, &[]);
            assert_eq!(
                (r.bwd_macs, r.bwd_gemms),
                (macs, gemms),
                "{blocks} row blocks"
            );
        }
        let masks = [
            MaskSpec::NONE,
            MaskSpec::CAUSAL_TOP_LEFT,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec::window(9, 0, DiagonalAlignment::TopLeft),
            MaskSpec::window(20, 6, DiagonalAlignment::BottomRight),
        ];
        let mut seed = 60;
        for mask in masks {
            for (sq, skv) in [(48, 48), (24, 56), (56, 24)] {
                let p = AttentionProblem::new(1, 4, 2, sq, skv, 16, 8, DType::BF16).with_mask(mask);
                let inp = random_inputs(&p, seed);
                seed += 1;
                for blocks in [1, 3, 4] {
                    let cfg = ChunkedConfig {
                        bwd_row_blocks: blocks,
                        ..cfg(16)
                    };
                    for kind in [PlanKind::Backward, PlanKind::BackwardFusedScores] {
                        let r = run_mock(&p, &cfg, kind, &inp, &[]);
                        let v = verify_mock(&p, &inp, r);
                        assert!(v.passed, "{p:?} {blocks} blocks {kind:?}: {v:#?}");
                    }
                }
            }
        }
    }

    #[test]
    fn mock_handles_padded_strides_and_single_chunk() {
        let mut p = AttentionProblem::new(1, 2, 1, 17, 30, 8, 16, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
        // Rows padded to 24 / 40 elements: padding must be neither read nor written.
        p.layout.q = Strides {
            batch: 17 * 2 * 24,
            head: 24,
            seq: 48,
        };
        p.layout.o = Strides {
            batch: 17 * 2 * 40,
            head: 40,
            seq: 80,
        };
        check(&p, 64, 7);
        check(&p, 4, 8);
    }

    #[test]
    fn plan_respects_budget() {
        let p = AttentionProblem::new(2, 8, 4, 16384, 16384, 512, 512, DType::BF16);
        let cfg = ChunkedConfig::default();
        let plan = plan::make_plan(&p, &cfg, PlanKind::Backward).unwrap();
        assert!(plan.bytes <= cfg.workspace_budget);
        assert!(plan.chunk_rows >= 512, "{plan:?}");
        let tiny = ChunkedConfig {
            workspace_budget: 1 << 20,
            ..cfg
        };
        assert!(matches!(
            plan::make_plan(&p, &tiny, PlanKind::Backward),
            Err(ExecError::Workspace { .. })
        ));
        // Without fp32 scores a score costs 4 bytes instead of 12: the same chunk in a third
        // of the score buffers.
        let fused = plan::make_plan(&p, &cfg, PlanKind::BackwardFusedScores).unwrap();
        assert_eq!(fused.chunk_rows, plan.chunk_rows);
        // Score buffers come first in the workspace, then the fp32 dK/dV accumulators.
        assert_eq!(3 * fused.off_acc_dk, plan.off_acc_dk, "{fused:?} {plan:?}");
    }

    #[test]
    fn fused_score_plans_take_the_largest_chunk_then_the_lanes_that_fit() {
        let cfg = ChunkedConfig::default();
        let fused = |b, hq, hkv, s| {
            let p = AttentionProblem::new(b, hq, hkv, s, s, 512, 512, DType::BF16);
            let pl = plan::make_plan(&p, &cfg, PlanKind::BackwardFusedScores).unwrap();
            assert!(pl.bytes <= cfg.workspace_budget, "{pl:?}");
            // Lanes are whole copies of one lane's buffers, D after them.
            assert_eq!(pl.off_d, pl.lanes as u64 * pl.lane_bytes);
            (pl.chunk_rows, pl.lanes)
        };
        // 2 x 2048 x 16384 x 4 bytes of P and dS + 32 MiB of dK/dV per lane: two lanes fit.
        assert_eq!(fused(2, 8, 4, 16384), (2048, 2));
        // At 32k one lane of 2048-row chunks (640 MiB) fits, two do not: one lane, same chunk.
        assert_eq!(fused(2, 8, 4, 32768), (2048, 1));
        // Eight query heads per KV head: 8192 rows per GEMM make chunks of 1024 rows.
        assert_eq!(fused(1, 32, 4, 16384), (1024, 1));
        // Never more lanes than groups.
        assert_eq!(fused(1, 8, 1, 4096).1, 1);
    }
}
