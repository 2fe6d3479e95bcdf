//! CPU implementation of the chunked algorithm's device operations over a byte arena, with
//! cuBLAS's column-major semantics and argument checks. It tests the orchestration (chunk
//! ranges, strides, GEMM mapping, masking, accumulation) against the float64 reference on
//! machines without a GPU. The CUDA kernels themselves are tested on the GPU.

use super::ChunkedConfig;
use super::plan::{
    self, BwdArgs, BwdScoresArgs, CastArgs, CublasGemm, Elem, FillF32Args, Ops, PlanKind,
    RowDotArgs, SoftmaxArgs, ZeroRowsArgs,
};
use crate::executor::{DeviceBackwardArgs, DeviceForwardArgs, ExecError, HostTensor};
use crate::problem::{AttentionProblem, DType};

struct Mock {
    mem: Vec<u8>,
    dtype: DType,
    launches: usize,
    /// The problem and tensors of a fused-score backward (what the fused executor's score
    /// kernel reads through its TMA maps).
    scores_of: Option<(AttentionProblem, DeviceBackwardArgs)>,
}

impl Mock {
    fn alloc(&mut self, bytes: u64) -> u64 {
        let at = (self.mem.len() as u64).div_ceil(256) * 256 + 256;
        self.mem.resize((at + bytes) as usize, 0xAB);
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
    /// Element `at` of P and dS: `P = exp(scale S - lse)`, `dS = P (dP - D)` from the fp32
    /// scores `(S, dP)` of an admitted key, zeros for a masked one (`None`). `stats` is
    /// `(scale, lse, D)`. Shared by `bwd_elementwise` and `bwd_scores`.
    fn store_p_ds(
        &mut self,
        p: u64,
        ds: u64,
        at: usize,
        scores: Option<(f32, f32)>,
        (scale, lse, d): (f32, f32, f32),
    ) {
        let (pv, dsv) = scores.map_or((0.0, 0.0), |(s, dp)| {
            let pv = (s * scale - lse).exp();
            (pv, pv * (dp - d))
        });
        self.set(p + 2 * at as u64, Elem::Low, pv as f64);
        self.set(ds + 2 * at as u64, Elem::Low, dsv as f64);
    }
}

impl Ops for Mock {
    fn gemm(&mut self, g: &CublasGemm) -> Result<(), ExecError> {
        self.launches += 1;
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
                    .map(|c| self.get(a.s + 4 * (row + c) as u64, Elem::F32) as f32 * a.scale * l2e)
                    .collect();
                let mx = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = xs.iter().map(|x| (x - mx).exp2()).sum();
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
                    self.store_p_ds(a.p, a.ds, row + c, scores, (a.scale, lse, d));
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
        for r in 0..a.rows {
            for c in 0..a.cols {
                self.set(a.dst + 4 * (r * a.ld + c) as u64, Elem::F32, a.value as f64);
            }
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
        let (m, scale) = (p.effective_mask(), p.softmax_scale as f32);
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
                let (lo_k, hi_k) = m.row_range(a.i0 + i);
                let lse = self.get(a.lse + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                let d = self.get(a.dvec + 4 * (r * a.head_stride + i) as u64, Elem::F32) as f32;
                let q = io.q + 2 * lq.offset(a.batch, h, a.i0 + i, 0) as u64;
                let d_o = io.d_o + 2 * lo.offset(a.batch, h, a.i0 + i, 0) as u64;
                for c in 0..a.lds {
                    let key = a.kv_lo + c;
                    let scores = ((key as i64) >= lo_k && (key as i64) < hi_k).then(|| {
                        let k = io.k + 2 * lk.offset(a.batch, a.kv_head, key, 0) as u64;
                        let v = io.v + 2 * lv.offset(a.batch, a.kv_head, key, 0) as u64;
                        (
                            dot(self, q, k, p.head_dim_qk),
                            dot(self, d_o, v, p.head_dim_v),
                        )
                    });
                    self.store_p_ds(a.p, a.ds, row + c, scores, (scale, lse, d));
                }
            }
        }
        Ok(())
    }
}

/// Chunked forward + backward on the CPU mock: `(O, LSE, dQ, dK, dV)`.
#[allow(clippy::type_complexity)]
fn run_mock(
    p: &AttentionProblem,
    cfg: &ChunkedConfig,
    backward: PlanKind,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    d_o: &HostTensor,
) -> (HostTensor, Vec<f32>, HostTensor, HostTensor, HostTensor) {
    let mut m = Mock {
        mem: Vec::new(),
        dtype: p.dtype,
        launches: 0,
        scores_of: None,
    };
    let (qa, ka, va, doa) = (
        m.put_tensor(q),
        m.put_tensor(k),
        m.put_tensor(v),
        m.put_tensor(d_o),
    );
    // Outputs start as garbage (0xAB) so unwritten elements are caught.
    let oa = m.alloc(2 * p.o_span() as u64);
    let lsea = m.alloc(4 * p.lse_len() as u64);
    let fplan = plan::make_plan(p, cfg, PlanKind::Forward).unwrap();
    let ws = m.alloc(fplan.bytes);
    let fio = DeviceForwardArgs {
        q: qa,
        k: ka,
        v: va,
        o: oa,
        lse: lsea,
        sink: 0,
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
        sink: 0,
        d_sink: 0,
    };
    m.scores_of = Some((p.clone(), bio));
    plan::backward(&mut m, p, &bplan, &bio, ws).unwrap();
    let lse = (0..p.lse_len())
        .map(|i| m.get(lsea + 4 * i as u64, Elem::F32) as f32)
        .collect();
    (
        m.take_tensor(oa, p.o_span()),
        lse,
        m.take_tensor(dqa, p.q_span()),
        m.take_tensor(dka, p.k_span()),
        m.take_tensor(dva, p.v_span()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DiagonalAlignment, LayoutKind, MaskSpec, Strides};
    use crate::trial::{random_inputs, verify};

    fn check(p: &AttentionProblem, chunk: usize, seed: u64) {
        let cfg = ChunkedConfig {
            max_chunk_rows: chunk,
            min_chunk_rows: 1,
            target_rows_per_gemm: chunk,
            workspace_budget: 1 << 30,
            fused_score_lanes: 2,
        };
        let inp = random_inputs(p, seed);
        // Both backward plans: fp32 scores through GEMMs, and P/dS from the fused executor's
        // score kernel (as the mock computes it).
        for kind in [PlanKind::Backward, PlanKind::BackwardFusedScores] {
            let (o, lse, dq, dk, dv) = run_mock(p, &cfg, kind, &inp.q, &inp.k, &inp.v, &inp.d_o);
            let bwd = crate::executor::BackwardOutput {
                dq,
                dk,
                dv,
                stats: Default::default(),
                d_sink: Vec::new(),
            };
            let v = verify(p, &inp, &o, &lse, Some(&bwd));
            assert!(v.passed, "{p:?} chunk {chunk} {kind:?}: {v:#?}");
        }
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
