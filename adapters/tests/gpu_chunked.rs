//! GPU tests of the chunked executor. Without the `cuda` feature, a driver or a GPU they print
//! why they skip. On a GPU they check, on fresh random inputs each run (the seed is printed):
//! - numerics: the FlashAttention criterion err(chunked, fp64) <= 2 err(naive same dtype, fp64)
//!   for O, dQ, dK, dV and LSE within 1e-5 relative of fp64, over head dims, dtypes, masks,
//!   windows, GQA/MHA/MQA, square/rectangular, layouts and chunkings;
//! - determinism: two backward runs are bitwise identical;
//! - validation: mismatched inputs are refused before any launch;
//! - soft-capping, off-by-one and learnable sinks (d_sink), padded (right, left) and packed
//!   sequences, alone and combined: the same criterion against a float64 oracle
//!   (the reference's, through `chunked::test_oracle`), outputs pre-filled with NaN, padding rows O = 0,
//!   LSE = -inf, dQ = 0 and padding keys dK = dV = 0, d_sink bitwise reproducible, the stream
//!   path bitwise equal to the synchronous one and a learnable call without its sink refused.

use attn_policy_adapters::chunked::{Chunked, ChunkedConfig};
use attn_policy_adapters::trial::{random_inputs, verify};
use attn_policy_adapters::{
    AttentionProblem, BackwardInputs, DType, DiagonalAlignment, ExecError, Executor, ForwardInputs,
    HostTensor, LayoutKind, MaskSpec, Strides, run_backward, run_forward,
};
use std::sync::Arc;

mod common;
use common::fresh_seed;

fn gpu(config: ChunkedConfig) -> Option<Arc<Chunked>> {
    match Chunked::new(config) {
        Ok(c) => {
            let c = Arc::new(c);
            println!("GPU: {}", c.device_description());
            Some(c)
        }
        Err(e) => {
            println!("skipped: no usable GPU for the chunked executor: {e}");
            None
        }
    }
}

fn small_chunks() -> ChunkedConfig {
    ChunkedConfig {
        max_chunk_rows: 48,
        target_rows_per_gemm: 48,
        min_chunk_rows: 8,
        ..Default::default()
    }
}

struct Case {
    p: AttentionProblem,
    label: String,
    small_chunks: bool,
}

type MaskFor = fn(bool) -> MaskSpec;

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let masks: [(&str, MaskFor); 4] = [
        ("no_mask", |_| MaskSpec::NONE),
        ("causal_tl", |_| MaskSpec::CAUSAL_TOP_LEFT),
        ("causal_br", |_| MaskSpec::CAUSAL_BOTTOM_RIGHT),
        ("window", |br| {
            MaskSpec::window(
                40,
                12,
                if br {
                    DiagonalAlignment::BottomRight
                } else {
                    DiagonalAlignment::TopLeft
                },
            )
        }),
    ];
    let mut n = 0usize;
    for d in [64usize, 128, 256, 320, 512] {
        for dtype in [DType::BF16, DType::F16] {
            for (mname, mask) in masks {
                for gqa in [true, false] {
                    n += 1;
                    // GQA square, or MHA rectangular (both s_q < s_kv and s_q > s_kv occur).
                    let (hq, hkv, sq, skv) = if gqa {
                        (4, 2, 128, 128)
                    } else if n % 4 < 2 {
                        (2, 2, 96, 160)
                    } else {
                        (2, 2, 160, 96)
                    };
                    let mut p = AttentionProblem::new(1, hq, hkv, sq, skv, d, d, dtype)
                        .with_mask(mask(!gqa));
                    let layout = match n % 3 {
                        0 => "bshd",
                        1 => {
                            p.set_layout(LayoutKind::Sbhd);
                            "sbhd"
                        }
                        _ => {
                            // Padded rows: every row of Q and O 8 elements longer.
                            p.layout.q = Strides {
                                batch: sq * hq * (d + 8),
                                head: d + 8,
                                seq: hq * (d + 8),
                            };
                            p.layout.o = Strides {
                                batch: sq * hq * (d + 8),
                                head: d + 8,
                                seq: hq * (d + 8),
                            };
                            "padded"
                        }
                    };
                    let shape = if gqa { "gqa" } else { "mha" };
                    out.push(Case {
                        label: format!("d{d} {dtype} {mname} {shape} {sq}x{skv} {layout}"),
                        p,
                        small_chunks: n.is_multiple_of(2),
                    });
                }
            }
        }
    }
    // head_dim_qk != head_dim_v, MQA, very large head dims.
    let extra = [
        (
            AttentionProblem::new(2, 4, 1, 100, 140, 192, 128, DType::BF16)
                .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT),
            "d192/128 bf16 causal_br mqa 100x140",
        ),
        (
            AttentionProblem::new(1, 4, 1, 96, 96, 1024, 1024, DType::BF16)
                .with_mask(MaskSpec::CAUSAL_TOP_LEFT),
            "d1024 bf16 causal_tl mqa 96x96",
        ),
        (
            AttentionProblem::new(1, 2, 2, 64, 80, 1024, 512, DType::F16)
                .with_mask(MaskSpec::window(16, 0, DiagonalAlignment::BottomRight)),
            "d1024/512 fp16 window_br mha 64x80",
        ),
    ];
    for (p, label) in extra {
        out.push(Case {
            p,
            label: label.to_string(),
            small_chunks: true,
        });
    }
    out
}

#[test]
fn numerics_flash_attention_criterion() {
    let Some(big) = gpu(ChunkedConfig::default()) else {
        return;
    };
    let Some(small) = gpu(small_chunks()) else {
        return;
    };
    let seed = fresh_seed();
    let cases = cases();
    let rows = common::in_parallel(&cases, |i, c| {
        let ex: &Arc<Chunked> = if c.small_chunks { &small } else { &big };
        let inp = random_inputs(&c.p, seed.wrapping_add(i as u64 * 7919));
        let f = run_forward(
            ex,
            &c.p,
            &ForwardInputs {
                q: &inp.q,
                k: &inp.k,
                v: &inp.v,
                sink: None,
            },
        )
        .unwrap_or_else(|e| panic!("{}: forward: {e}", c.label));
        let b = run_backward(
            ex,
            &c.p,
            &BackwardInputs {
                q: &inp.q,
                k: &inp.k,
                v: &inp.v,
                o: &f.o,
                d_o: &inp.d_o,
                lse: &f.lse,
                sink: None,
            },
        )
        .unwrap_or_else(|e| panic!("{}: backward: {e}", c.label));
        let v = verify(&c.p, &inp, &f.o, &f.lse, Some(&b));
        let mut line = format!(
            "| {} | {} |",
            c.label,
            if c.small_chunks { "48" } else { "2048" }
        );
        for ch in &v.checks {
            line += &format!(" {:.2e} / {:.2e} |", ch.err, ch.naive_err);
        }
        line += &format!(
            " {:.1e} | {} |",
            v.lse_rel_err,
            if v.passed { "pass" } else { "FAIL" }
        );
        (line, v.passed)
    });
    println!(
        "\n| case | chunk rows | O err / naive | dQ err / naive | dK err / naive | dV err / naive | LSE rel err | result |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (_, line, _) in &rows {
        println!("{line}");
    }
    let failed: Vec<_> = rows.iter().filter(|r| !r.2).map(|r| r.1.clone()).collect();
    println!("{} cases, {} failed", rows.len(), failed.len());
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

#[test]
fn backward_is_bitwise_deterministic() {
    let Some(ex) = gpu(ChunkedConfig {
        max_chunk_rows: 256,
        ..Default::default()
    }) else {
        return;
    };
    let seed = fresh_seed();
    let p = AttentionProblem::new(2, 8, 2, 1024, 1280, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let inp = random_inputs(&p, seed);
    let f = run_forward(
        &ex,
        &p,
        &ForwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            sink: None,
        },
    )
    .unwrap();
    let bin = BackwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        o: &f.o,
        d_o: &inp.d_o,
        lse: &f.lse,
        sink: None,
    };
    let a = run_backward(&ex, &p, &bin).unwrap();
    let b = run_backward(&ex, &p, &bin).unwrap();
    let f2 = run_forward(
        &ex,
        &p,
        &ForwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            sink: None,
        },
    )
    .unwrap();
    assert_eq!(f.o, f2.o, "forward O differs between runs");
    assert!(
        f.lse
            .iter()
            .zip(&f2.lse)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );
    assert_eq!(a.dq, b.dq, "dQ differs between runs");
    assert_eq!(a.dk, b.dk, "dK differs between runs");
    assert_eq!(a.dv, b.dv, "dV differs between runs");
    assert!(a.dq.data.iter().any(|&x| x != 0), "dQ is all zero");
    println!("deterministic: forward and backward bitwise identical over 2 runs");
}

#[test]
fn mismatched_inputs_are_refused_before_launch() {
    let Some(ex) = gpu(ChunkedConfig::default()) else {
        return;
    };
    let p = AttentionProblem::new(1, 4, 2, 64, 64, 64, 64, DType::BF16);
    let inp = random_inputs(&p, 3);
    let wrong = HostTensor {
        dtype: DType::F16,
        data: inp.q.data.clone(),
    };
    let e = run_forward(
        &ex,
        &p,
        &ForwardInputs {
            q: &wrong,
            k: &inp.k,
            v: &inp.v,
            sink: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    let f = run_forward(
        &ex,
        &p,
        &ForwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            sink: None,
        },
    )
    .unwrap();
    let wrong_do = HostTensor {
        dtype: DType::F16,
        data: inp.d_o.data.clone(),
    };
    let e = run_backward(
        &ex,
        &p,
        &BackwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            o: &f.o,
            d_o: &wrong_do,
            lse: &f.lse,
            sink: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    let short = HostTensor {
        dtype: DType::BF16,
        data: inp.k.data[..10].to_vec(),
    };
    let e = run_forward(
        &ex,
        &p,
        &ForwardInputs {
            q: &inp.q,
            k: &short,
            v: &inp.v,
            sink: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    // Misaligned device pointer (device path exists only in the cuda build).
    #[cfg(feature = "cuda")]
    {
        let q = ex.upload(&inp.q.data).unwrap();
        let k = ex.upload(&inp.k.data).unwrap();
        let v = ex.upload(&inp.v.data).unwrap();
        let o = ex.alloc(2 * p.o_span()).unwrap();
        let lse = ex.alloc(4 * p.lse_len()).unwrap();
        let args = attn_policy_adapters::DeviceForwardArgs {
            q: q.ptr() + 2,
            k: k.ptr(),
            v: v.ptr(),
            o: o.ptr(),
            lse: lse.ptr(),
            sink: 0,
        };
        // SAFETY: pointers are live; the misaligned one must be refused before use.
        use attn_policy_adapters::{DeviceIo, Direction};
        let plan = ex.plan(&p, Direction::Forward).unwrap();
        // SAFETY: as above.
        let e = unsafe { plan.run_device(&DeviceIo::Forward(args)) }.unwrap_err();
        assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    }
    // Unsupported head dim: typed refusal, not an error.
    let p12 = AttentionProblem::new(1, 4, 2, 64, 64, 12, 12, DType::BF16);
    let inp12 = random_inputs(&p12, 4);
    let e = run_forward(
        &ex,
        &p12,
        &ForwardInputs {
            q: &inp12.q,
            k: &inp12.k,
            v: &inp12.v,
            sink: None,
        },
    )
    .unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    println!("refusals: dtype (q, dO), length, alignment, head_dim all refused with typed errors");
}

/// The stream path: a foreign stream (not the executor's), the caller's workspace, no
/// synchronisation inside; results bitwise equal to the synchronous path, and a wrong device or
/// a short workspace refused before any launch.
#[cfg(feature = "cuda")]
#[test]
fn stream_path_on_a_foreign_stream_matches_the_synchronous_path() {
    use attn_policy_adapters::{
        DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, Direction, StreamLaunch,
    };
    let Some(ex) = gpu(ChunkedConfig::default()) else {
        return;
    };
    let seed = fresh_seed();
    let p = AttentionProblem::new(2, 8, 2, 200, 300, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let q = ex.random(p.dtype, p.q_span(), seed).unwrap();
    let k = ex.random(p.dtype, p.k_span(), seed + 1).unwrap();
    let v = ex.random(p.dtype, p.v_span(), seed + 2).unwrap();
    let d_o = ex.random(p.dtype, p.o_span(), seed + 3).unwrap();
    let outs = || {
        let o = ex.alloc(2 * p.o_span()).unwrap();
        let lse = ex.alloc(4 * p.lse_len()).unwrap();
        ex.poison(&o, 0).unwrap();
        (o, lse)
    };
    let (o1, l1) = outs();
    let (o2, l2) = outs();
    let fa = |o: &attn_policy_adapters::chunked::DeviceBuffer,
              l: &attn_policy_adapters::chunked::DeviceBuffer| {
        DeviceIo::Forward(DeviceForwardArgs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            o: o.ptr(),
            lse: l.ptr(),
            sink: 0,
        })
    };
    let fplan = ex.plan(&p, Direction::Forward).unwrap();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { fplan.run_device(&fa(&o1, &l1)) }.unwrap();
    // A stream the executor does not own, as a framework's would be.
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let side = ctx.new_stream().unwrap();
    let ws_bytes = fplan.workspace_bytes().unwrap();
    let ws = ex.alloc(ws_bytes as usize).unwrap();
    let launch = StreamLaunch {
        device: 0,
        stream: side.cu_stream() as u64,
        workspace: ws.ptr(),
        workspace_bytes: ws_bytes,
    };
    // Refusals first: another device, a short workspace.
    let other = StreamLaunch {
        device: 7,
        ..launch
    };
    assert!(matches!(
        // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
        unsafe { fplan.enqueue(&fa(&o2, &l2), &other) },
        Err(ExecError::InvalidInput { .. })
    ));
    let short = StreamLaunch {
        workspace_bytes: ws_bytes - 256,
        ..launch
    };
    assert!(matches!(
        // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
        unsafe { fplan.enqueue(&fa(&o2, &l2), &short) },
        Err(ExecError::InvalidInput { .. })
    ));
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { fplan.enqueue(&fa(&o2, &l2), &launch) }.unwrap();
    side.synchronize().unwrap();
    assert_eq!(
        ex.download_u16(&o1, p.o_span()).unwrap(),
        ex.download_u16(&o2, p.o_span()).unwrap(),
        "O differs between the stream path and the synchronous path"
    );
    assert_eq!(
        ex.download_f32(&l1, p.lse_len())
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        ex.download_f32(&l2, p.lse_len())
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    );
    let grads = || {
        [p.q_span(), p.k_span(), p.v_span()].map(|n| {
            let b = ex.alloc(2 * n).unwrap();
            ex.poison(&b, 0).unwrap();
            b
        })
    };
    let (g1, g2) = (grads(), grads());
    let ba = |g: &[attn_policy_adapters::chunked::DeviceBuffer; 3]| {
        DeviceIo::Backward(DeviceBackwardArgs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            o: o1.ptr(),
            d_o: d_o.ptr(),
            lse: l1.ptr(),
            dq: g[0].ptr(),
            dk: g[1].ptr(),
            dv: g[2].ptr(),
            sink: 0,
            d_sink: 0,
        })
    };
    let bplan = ex.plan(&p, Direction::Backward).unwrap();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { bplan.run_device(&ba(&g1)) }.unwrap();
    let bws_bytes = bplan.workspace_bytes().unwrap();
    let bws = ex.alloc(bws_bytes as usize).unwrap();
    let blaunch = StreamLaunch {
        workspace: bws.ptr(),
        workspace_bytes: bws_bytes,
        ..launch
    };
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { bplan.enqueue(&ba(&g2), &blaunch) }.unwrap();
    side.synchronize().unwrap();
    for (i, n) in [p.q_span(), p.k_span(), p.v_span()].into_iter().enumerate() {
        assert_eq!(
            ex.download_u16(&g1[i], n).unwrap(),
            ex.download_u16(&g2[i], n).unwrap(),
            "gradient {i} differs between the stream path and the synchronous path"
        );
    }
    println!("stream path: forward and backward bitwise equal to the synchronous path");
}

// ---- Soft-capping, sinks and per-sequence lengths ----------------------------------------

use attn_policy_adapters::chunked::test_oracle as oracle;

/// A problem with the features: soft-capping, sink, per-sequence lengths.
#[cfg(feature = "cuda")]
fn featured(
    base: AttentionProblem,
    softcap: Option<f64>,
    softmax: attn_policy_adapters::SoftmaxKind,
    seqlens: Option<attn_policy_adapters::SeqLens>,
) -> AttentionProblem {
    let mut p = match seqlens {
        Some(s) => base.with_seqlens(s, LayoutKind::Bshd),
        None => base,
    };
    p.softcap = softcap;
    p.softmax = softmax;
    p
}

#[cfg(feature = "cuda")]
fn feature_cases() -> Vec<(String, AttentionProblem)> {
    use attn_policy_adapters::{SeqLens, SeqPacking, SoftmaxKind};
    let mut out = Vec::new();
    // Four sequences: full length, shorter, no query rows, one token.
    let padded = |side| SeqLens::padded(side, vec![130, 41, 0, 1], vec![110, 150, 17, 1]);
    let packed =
        || SeqLens::from_cu_seqlens(&[0, 130, 171, 171, 172], &[0, 110, 260, 277, 278]).unwrap();
    let masks = [
        ("no_mask", MaskSpec::NONE),
        ("causal_br", MaskSpec::CAUSAL_BOTTOM_RIGHT),
        ("causal_tl", MaskSpec::CAUSAL_TOP_LEFT),
        (
            "window_br",
            MaskSpec::window(40, 12, DiagonalAlignment::BottomRight),
        ),
    ];
    let mut n = 0usize;
    for dtype in [DType::BF16, DType::F16] {
        for (d_qk, d_v) in [(128, 128), (192, 128), (64, 64)] {
            let variants: [(&str, Option<f64>, SoftmaxKind, Option<SeqLens>); 10] = [
                ("softcap 30", Some(30.0), SoftmaxKind::Vanilla, None),
                ("softcap 5", Some(5.0), SoftmaxKind::Vanilla, None),
                ("off-by-one", None, SoftmaxKind::OffByOne, None),
                ("learnable", None, SoftmaxKind::Learnable, None),
                (
                    "padded right",
                    None,
                    SoftmaxKind::Vanilla,
                    Some(padded(SeqPacking::PaddedRight)),
                ),
                (
                    "padded left",
                    None,
                    SoftmaxKind::Vanilla,
                    Some(padded(SeqPacking::PaddedLeft)),
                ),
                ("packed", None, SoftmaxKind::Vanilla, Some(packed())),
                (
                    "padded right softcap 20 learnable",
                    Some(20.0),
                    SoftmaxKind::Learnable,
                    Some(padded(SeqPacking::PaddedRight)),
                ),
                (
                    "padded left softcap 20 off-by-one",
                    Some(20.0),
                    SoftmaxKind::OffByOne,
                    Some(padded(SeqPacking::PaddedLeft)),
                ),
                (
                    "packed softcap 20 learnable",
                    Some(20.0),
                    SoftmaxKind::Learnable,
                    Some(packed()),
                ),
            ];
            for (vname, softcap, softmax, seqlens) in variants {
                // The masks take turns, so each variant meets several over dtypes and dims.
                let (mname, mask) = masks[n % masks.len()];
                n += 1;
                let base = if seqlens.is_some() {
                    AttentionProblem::new(4, 4, 2, 130, 150, d_qk, d_v, dtype)
                } else {
                    AttentionProblem::new(2, 4, 2, 128, 160, d_qk, d_v, dtype)
                };
                out.push((
                    format!("{dtype} d{d_qk}/{d_v} {mname} {vname}"),
                    featured(base.with_mask(mask), softcap, softmax, seqlens),
                ));
            }
        }
    }
    out
}

/// Forward and backward through the device path with every output buffer pre-filled with
/// NaN (0xff bytes), so a padding row or key the executor does not write shows; returns
/// `(O, LSE, dQ, dK, dV, d_sink)`.
#[cfg(feature = "cuda")]
#[allow(clippy::type_complexity)]
fn device_run(
    ex: &Arc<Chunked>,
    p: &AttentionProblem,
    inp: &attn_policy_adapters::trial::RandomInputs,
    sink: &[f32],
) -> (
    HostTensor,
    Vec<f32>,
    HostTensor,
    HostTensor,
    HostTensor,
    Vec<f32>,
) {
    use attn_policy_adapters::{DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, Direction};
    let nan = |bytes: usize| {
        let b = ex.alloc(bytes).unwrap();
        ex.poison(&b, 0xff).unwrap();
        b
    };
    let (q, k, v, d_o) = (
        ex.upload(&inp.q.data).unwrap(),
        ex.upload(&inp.k.data).unwrap(),
        ex.upload(&inp.v.data).unwrap(),
        ex.upload(&inp.d_o.data).unwrap(),
    );
    let s = ex
        .upload_f32(if sink.is_empty() { &[0.0] } else { sink })
        .unwrap();
    let (o, lse) = (nan(2 * p.o_span()), nan(4 * p.lse_len()));
    let (dq, dk, dv, ds) = (
        nan(2 * p.q_span()),
        nan(2 * p.k_span()),
        nan(2 * p.v_span()),
        nan(4 * p.heads_q),
    );
    let (sp, dsp) = if sink.is_empty() {
        (0, 0)
    } else {
        (s.ptr(), ds.ptr())
    };
    let fplan = ex.plan(p, Direction::Forward).unwrap();
    let fa = DeviceForwardArgs {
        q: q.ptr(),
        k: k.ptr(),
        v: v.ptr(),
        o: o.ptr(),
        lse: lse.ptr(),
        sink: sp,
    };
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to
    // the end of the call, which synchronises.
    unsafe { fplan.run_device(&DeviceIo::Forward(fa)) }.unwrap();
    let bplan = ex.plan(p, Direction::Backward).unwrap();
    let ba = DeviceBackwardArgs {
        q: q.ptr(),
        k: k.ptr(),
        v: v.ptr(),
        o: o.ptr(),
        d_o: d_o.ptr(),
        lse: lse.ptr(),
        dq: dq.ptr(),
        dk: dk.ptr(),
        dv: dv.ptr(),
        sink: sp,
        d_sink: dsp,
    };
    // SAFETY: as above.
    unsafe { bplan.run_device(&DeviceIo::Backward(ba)) }.unwrap();
    let t = |b, n| HostTensor {
        dtype: p.dtype,
        data: ex.download_u16(b, n).unwrap(),
    };
    (
        t(&o, p.o_span()),
        ex.download_f32(&lse, p.lse_len()).unwrap(),
        t(&dq, p.q_span()),
        t(&dk, p.k_span()),
        t(&dv, p.v_span()),
        if sink.is_empty() {
            Vec::new()
        } else {
            ex.download_f32(&ds, p.sink_len()).unwrap()
        },
    )
}

/// Soft-capping, both sinks (d_sink included), padded right / left and packed sequences, alone
/// and combined, over dtypes, head dims (192/128 too), masks and GQA: the FlashAttention
/// criterion against the float64 oracle, outputs pre-filled with NaN.
#[cfg(feature = "cuda")]
#[test]
fn features_meet_the_flash_attention_criterion() {
    let Some(ex) = gpu(small_chunks()) else {
        return;
    };
    let Some(big) = gpu(ChunkedConfig::default()) else {
        return;
    };
    let seed = fresh_seed();
    let cases = feature_cases();
    let rows = common::in_parallel(&cases, |i, (label, p)| {
        // Chunks of 48 rows and of up to 2048 in turn.
        let e = if i.is_multiple_of(2) { &ex } else { &big };
        let s = seed.wrapping_add(i as u64 * 7919);
        let inp = random_inputs(p, s);
        let sink = inp.sink.clone().unwrap_or_default();
        let (o, lse, dq, dk, dv, d_sink) = device_run(e, p, &inp, &sink);
        let (checks, passed) = oracle::oracle_verify(
            p,
            [&inp.q, &inp.k, &inp.v, &inp.d_o],
            &sink,
            &o,
            &lse,
            Some((&dq, &dk, &dv, &d_sink)),
        );
        let mut line = format!("| {label} |");
        for c in &checks {
            line += &format!(" {:.2e} / {:.2e} |", c.1, c.2);
        }
        line += if passed { " pass |" } else { " FAIL |" };
        (line, passed)
    });
    println!("\n| case | O | LSE | dQ | dK | dV | d_sink | result |");
    println!("|---|---|---|---|---|---|---|---|");
    for (_, line, _) in &rows {
        println!("{line}");
    }
    let failed: Vec<_> = rows.iter().filter(|r| !r.2).map(|r| r.1.clone()).collect();
    println!("{} cases, {} failed", cases.len(), failed.len());
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

/// Padding rows get O = 0, LSE = -inf, dQ = 0 and padding keys dK = dV = 0, written into
/// buffers that held NaN; the learnable sink's gradient is bitwise reproducible.
#[cfg(feature = "cuda")]
#[test]
fn padding_rows_and_keys_are_written_and_d_sink_is_deterministic() {
    use attn_policy_adapters::{SeqLens, SeqPacking, SoftmaxKind};
    let Some(ex) = gpu(small_chunks()) else {
        return;
    };
    let seed = fresh_seed();
    for side in [SeqPacking::PaddedRight, SeqPacking::PaddedLeft] {
        let lens = SeqLens::padded(side, vec![100, 7, 0], vec![64, 130, 9]);
        let mut p = AttentionProblem::new(3, 4, 2, 100, 130, 64, 64, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
            .with_seqlens(lens, LayoutKind::Bshd);
        p.softmax = SoftmaxKind::Learnable;
        p.softcap = Some(10.0);
        let inp = random_inputs(&p, seed);
        let sink = inp.sink.clone().unwrap_or_default();
        let (o, lse, dq, dk, dv, d_sink) = device_run(&ex, &p, &inp, &sink);
        let mut pad_rows = 0;
        for b in 0..p.batch {
            let (qr, kr) = p.seq_rows(b);
            for row in (0..p.seqlen_q).filter(|r| *r < qr.start || *r >= qr.start + qr.len) {
                pad_rows += 1;
                for h in 0..p.heads_q {
                    assert_eq!(
                        lse[p.lse_index(b, h, row)],
                        f32::NEG_INFINITY,
                        "{side:?} lse"
                    );
                    let (oo, qo) = (
                        p.layout.o.offset(b, h, row, 0),
                        p.layout.q.offset(b, h, row, 0),
                    );
                    assert!(
                        o.data[oo..oo + p.head_dim_v].iter().all(|&x| x == 0),
                        "{side:?} O"
                    );
                    assert!(
                        dq.data[qo..qo + p.head_dim_qk].iter().all(|&x| x == 0),
                        "{side:?} dQ"
                    );
                }
            }
            for key in (0..p.seqlen_kv).filter(|r| *r < kr.start || *r >= kr.start + kr.len) {
                for g in 0..p.heads_kv {
                    let (ko, vo) = (
                        p.layout.k.offset(b, g, key, 0),
                        p.layout.v.offset(b, g, key, 0),
                    );
                    assert!(
                        dk.data[ko..ko + p.head_dim_qk].iter().all(|&x| x == 0),
                        "{side:?} dK"
                    );
                    assert!(
                        dv.data[vo..vo + p.head_dim_v].iter().all(|&x| x == 0),
                        "{side:?} dV"
                    );
                }
            }
        }
        assert!(pad_rows > 100, "the case has padding rows");
        let (checks, passed) = oracle::oracle_verify(
            &p,
            [&inp.q, &inp.k, &inp.v, &inp.d_o],
            &sink,
            &o,
            &lse,
            Some((&dq, &dk, &dv, &d_sink)),
        );
        assert!(passed, "{side:?}: {checks:?}");
        let again = device_run(&ex, &p, &inp, &sink);
        assert_eq!(
            d_sink.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again.5.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "d_sink differs between runs"
        );
        assert_eq!(
            (dq, dk, dv),
            (again.2, again.3, again.4),
            "gradients differ between runs"
        );
        println!("{side:?}: padding written (O, LSE, dQ, dK, dV), d_sink bitwise reproducible");
    }
}

/// The host path carries the sink logits and returns d_sink; a learnable problem without its
/// logits is invalid input, not a vanilla softmax.
#[test]
fn host_path_learnable_sink() {
    use attn_policy_adapters::SoftmaxKind;
    let Some(ex) = gpu(ChunkedConfig::default()) else {
        return;
    };
    let seed = fresh_seed();
    let mut p = AttentionProblem::new(2, 8, 2, 256, 320, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    p.softmax = SoftmaxKind::Learnable;
    let inp = random_inputs(&p, seed);
    let sink = inp.sink.clone().unwrap_or_default();
    let fin = |sink| ForwardInputs {
        q: &inp.q,
        k: &inp.k,
        v: &inp.v,
        sink,
    };
    let e = run_forward(&ex, &p, &fin(None)).unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    let f = run_forward(&ex, &p, &fin(Some(&sink))).unwrap();
    let b = run_backward(
        &ex,
        &p,
        &BackwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            o: &f.o,
            d_o: &inp.d_o,
            lse: &f.lse,
            sink: Some(&sink),
        },
    )
    .unwrap();
    assert_eq!(b.d_sink.len(), p.heads_q);
    let (checks, passed) = oracle::oracle_verify(
        &p,
        [&inp.q, &inp.k, &inp.v, &inp.d_o],
        &sink,
        &f.o,
        &f.lse,
        Some((&b.dq, &b.dk, &b.dv, &b.d_sink)),
    );
    assert!(passed, "{checks:?}");
    println!("host path: learnable sink and d_sink pass: {checks:?}");
}

/// The stream path with the features (packed THD, soft-capping, learnable sink): bitwise equal
/// to the synchronous path, d_sink included, and a learnable problem without its sink or
/// d_sink pointer refused before any launch.
#[cfg(feature = "cuda")]
#[test]
fn stream_path_serves_the_features() {
    use attn_policy_adapters::{
        DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, Direction, SeqLens, SoftmaxKind,
        StreamLaunch,
    };
    let Some(ex) = gpu(small_chunks()) else {
        return;
    };
    let seed = fresh_seed();
    let lens = SeqLens::from_cu_seqlens(&[0, 90, 91, 200], &[0, 120, 150, 190]).unwrap();
    let mut p = AttentionProblem::new(3, 8, 2, 109, 120, 128, 128, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
        .with_seqlens(lens, LayoutKind::Bshd);
    p.softcap = Some(30.0);
    p.softmax = SoftmaxKind::Learnable;
    let inp = random_inputs(&p, seed);
    let sink = inp.sink.clone().unwrap_or_default();
    let (o1, l1, dq1, dk1, dv1, ds1) = device_run(&ex, &p, &inp, &sink);
    let up = |t: &HostTensor| ex.upload(&t.data).unwrap();
    let (q, k, v, d_o, o) = (up(&inp.q), up(&inp.k), up(&inp.v), up(&inp.d_o), up(&o1));
    let lse = ex.upload_f32(&l1).unwrap();
    let s = ex.upload_f32(&sink).unwrap();
    let nan = |bytes: usize| {
        let b = ex.alloc(bytes).unwrap();
        ex.poison(&b, 0xff).unwrap();
        b
    };
    let (o2, l2) = (nan(2 * p.o_span()), nan(4 * p.lse_len()));
    let (dq, dk, dv, ds) = (
        nan(2 * p.q_span()),
        nan(2 * p.k_span()),
        nan(2 * p.v_span()),
        nan(4 * p.heads_q),
    );
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let side = ctx.new_stream().unwrap();
    let launch_for = |plan: &Arc<dyn attn_policy_adapters::Plan>| {
        let bytes = plan.workspace_bytes().unwrap();
        let ws = ex.alloc(bytes as usize).unwrap();
        let l = StreamLaunch {
            device: 0,
            stream: side.cu_stream() as u64,
            workspace: ws.ptr(),
            workspace_bytes: bytes,
        };
        (ws, l)
    };
    let fplan = ex.plan(&p, Direction::Forward).unwrap();
    let (_fws, fl) = launch_for(&fplan);
    let fa = |sink| {
        DeviceIo::Forward(DeviceForwardArgs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            o: o2.ptr(),
            lse: l2.ptr(),
            sink,
        })
    };
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to
    // the end of the test; the stream is synchronised before reading.
    let e = unsafe { fplan.enqueue(&fa(0), &fl) }.unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    // SAFETY: as above.
    unsafe { fplan.enqueue(&fa(s.ptr()), &fl) }.unwrap();
    let bplan = ex.plan(&p, Direction::Backward).unwrap();
    let (_bws, bl) = launch_for(&bplan);
    let ba = |d_sink| {
        DeviceIo::Backward(DeviceBackwardArgs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            o: o.ptr(),
            d_o: d_o.ptr(),
            lse: lse.ptr(),
            dq: dq.ptr(),
            dk: dk.ptr(),
            dv: dv.ptr(),
            sink: s.ptr(),
            d_sink,
        })
    };
    // SAFETY: as above.
    let e = unsafe { bplan.enqueue(&ba(0), &bl) }.unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    // SAFETY: as above.
    unsafe { bplan.enqueue(&ba(ds.ptr()), &bl) }.unwrap();
    side.synchronize().unwrap();
    let t = |b, n| HostTensor {
        dtype: p.dtype,
        data: ex.download_u16(b, n).unwrap(),
    };
    let bits = |x: Vec<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(o1, t(&o2, p.o_span()), "O");
    assert_eq!(
        bits(l1),
        bits(ex.download_f32(&l2, p.lse_len()).unwrap()),
        "LSE"
    );
    assert_eq!(dq1, t(&dq, p.q_span()), "dQ");
    assert_eq!(dk1, t(&dk, p.k_span()), "dK");
    assert_eq!(dv1, t(&dv, p.v_span()), "dV");
    assert_eq!(
        bits(ds1),
        bits(ex.download_f32(&ds, p.sink_len()).unwrap()),
        "d_sink"
    );
    println!("stream path with features: bitwise equal to the synchronous path");
}
