//! GPU tests of the fused (wgmma, SM90) executor. Without the `cuda` feature, a driver or an SM90
//! GPU they print why they skip. On an H100/H200 they check, on fresh random inputs each run
//! (the seed is printed):
//! - numerics: the FlashAttention criterion err(fused, fp64) <= 2 err(naive same dtype, fp64) for
//!   O, dQ, dK and dV, and LSE within 1e-5 relative of fp64, over head dims 264..512 (padded
//!   tails), dtypes, masks, windows, GQA/MHA/MQA, square/rectangular, layouts and query/key
//!   tails; every other case runs the backward in chunks of 200 rows (chunk boundaries inside
//!   the 128-row score tiles);
//! - determinism: two forward runs, and two backward runs, are bitwise identical;
//! - refusals before launch: problems outside the manifest, mismatched inputs;
//! - the stream path on a foreign stream, and its CUDA-graph capture replayed, match the
//!   synchronous path bit for bit (forward and backward).

use attn_policy_adapters::chunked::ChunkedConfig;
use attn_policy_adapters::fused::Fused;
use attn_policy_adapters::trial::{random_inputs, verify};
use attn_policy_adapters::{
    AttentionProblem, BackwardInputs, DType, DiagonalAlignment, Direction, ExecError, Executor,
    ForwardInputs, HostTensor, LayoutKind, MaskSpec, Strides, run_backward, run_forward,
};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

fn gpu() -> Option<Arc<Fused>> {
    gpu_with(ChunkedConfig::default())
}

/// Backward chunks of 200 query rows: not a multiple of the score kernel's 128-row tiles.
fn small_chunks() -> ChunkedConfig {
    ChunkedConfig {
        max_chunk_rows: 200,
        target_rows_per_gemm: 200,
        min_chunk_rows: 1,
        ..Default::default()
    }
}

fn gpu_with(chunks: ChunkedConfig) -> Option<Arc<Fused>> {
    match Fused::with_chunking(0, chunks) {
        Ok(f) => {
            let f = Arc::new(f);
            println!("GPU: {}", f.device_description());
            Some(f)
        }
        Err(e) => {
            println!("skipped: no usable SM90 GPU for the fused executor: {e}");
            None
        }
    }
}

fn fresh_seed() -> u64 {
    let s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    println!("seed {s}");
    s
}

type MaskFor = fn(bool) -> MaskSpec;

fn cases() -> Vec<(AttentionProblem, String)> {
    let masks: [(&str, MaskFor); 4] = [
        ("no_mask", |_| MaskSpec::NONE),
        ("causal_tl", |_| MaskSpec::CAUSAL_TOP_LEFT),
        ("causal_br", |_| MaskSpec::CAUSAL_BOTTOM_RIGHT),
        ("window", |br| {
            MaskSpec::window(
                70,
                9,
                if br {
                    DiagonalAlignment::BottomRight
                } else {
                    DiagonalAlignment::TopLeft
                },
            )
        }),
    ];
    let mut out = Vec::new();
    let mut n = 0usize;
    // 264: qk and v padded to 320; 328 (qk 384, all of Q in registers), 392 and 456 (qk 448 and
    // 512: part of Q in shared memory) exercise the other tails.
    for (d, dv) in [(264, 264), (328, 392), (456, 456), (512, 512), (512, 320)] {
        for dtype in [DType::BF16, DType::F16] {
            for (mname, mask) in masks {
                for shape in ["gqa", "mha", "mqa"] {
                    n += 1;
                    // Query and key counts that are not multiples of the 64-row tiles, both
                    // s_q < s_kv and s_q > s_kv.
                    let (b, hq, hkv, sq, skv) = match shape {
                        "gqa" => (1, 4, 2, 130, 130),
                        "mha" if n.is_multiple_of(2) => (2, 2, 2, 96, 200),
                        "mha" => (1, 2, 2, 200, 72),
                        _ => (1, 3, 1, 77, 150),
                    };
                    let mut p = AttentionProblem::new(b, hq, hkv, sq, skv, d, dv, dtype)
                        .with_mask(mask(n % 2 == 1));
                    let layout = match n % 3 {
                        0 => "bshd",
                        1 => {
                            p.set_layout(LayoutKind::Sbhd);
                            "sbhd"
                        }
                        _ => {
                            // Padded rows: every row of Q and O 8 elements longer.
                            let (qd, od) = (d + 8, dv + 8);
                            p.layout.q = Strides {
                                batch: sq * hq * qd,
                                head: qd,
                                seq: hq * qd,
                            };
                            p.layout.o = Strides {
                                batch: sq * hq * od,
                                head: od,
                                seq: hq * od,
                            };
                            "padded"
                        }
                    };
                    out.push((
                        p,
                        format!("d{d}/{dv} {dtype} {mname} {shape} b{b} {sq}x{skv} {layout}"),
                    ));
                }
            }
        }
    }
    // Long enough for many key tiles (online-softmax rescaling), a large softmax scale.
    let mut p = AttentionProblem::new(1, 2, 1, 700, 1100, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    p.softmax_scale = 0.2;
    out.push((p, "d512 bf16 causal_br mqa 700x1100 scale 0.2".into()));
    let p = AttentionProblem::new(1, 2, 2, 640, 640, 384, 384, DType::F16)
        .with_mask(MaskSpec::window(200, 0, DiagonalAlignment::TopLeft));
    out.push((p, "d384 fp16 window(200,0) mha 640x640".into()));
    // qk padded to 448: 384 Q columns in registers, 64 in shared memory.
    let p = AttentionProblem::new(1, 4, 2, 200, 330, 392, 456, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    out.push((p, "d392/456 bf16 causal_br gqa 200x330".into()));
    let mut p = AttentionProblem::new(2, 3, 1, 150, 77, 440, 264, DType::F16);
    p.set_layout(LayoutKind::Sbhd);
    out.push((p, "d440/264 fp16 no mask mqa b2 150x77 sbhd".into()));
    // Bottom-right causal with s_q > s_kv: the first rows admit no key (O = 0, LSE = -inf).
    let p = AttentionProblem::new(1, 2, 1, 300, 100, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    out.push((p, "d512 bf16 causal_br empty rows 300x100".into()));
    out
}

#[test]
fn numerics_flash_attention_criterion_forward_and_backward() {
    let Some(big) = gpu() else { return };
    let Some(small) = gpu_with(small_chunks()) else {
        return;
    };
    let seed = fresh_seed();
    let cases = cases();
    let rows: Mutex<Vec<(usize, String, bool)>> = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((p, label)) = cases.get(i) else {
                        break;
                    };
                    let inp = random_inputs(p, seed.wrapping_add(i as u64 * 7919));
                    let small_chunked = i % 2 == 1;
                    let ex = if small_chunked { &small } else { &big };
                    let f = run_forward(
                        ex,
                        p,
                        &ForwardInputs {
                            q: &inp.q,
                            k: &inp.k,
                            v: &inp.v,
                            sink: None,
                        },
                    )
                    .unwrap_or_else(|e| panic!("{label}: forward: {e}"));
                    let b = run_backward(
                        ex,
                        p,
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
                    .unwrap_or_else(|e| panic!("{label}: backward: {e}"));
                    let v = verify(p, &inp, &f.o, &f.lse, Some(&b));
                    let mut line = format!(
                        "| {label} | {} |",
                        if small_chunked { "200" } else { "2048" }
                    );
                    for c in &v.checks {
                        line += &format!(" {:.2e} / {:.2e} |", c.err, c.naive_err);
                    }
                    line += &format!(
                        " {:.1e} | {} |",
                        v.lse_rel_err,
                        if v.passed { "pass" } else { "FAIL" }
                    );
                    rows.lock().unwrap().push((i, line, v.passed));
                }
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by_key(|r| r.0);
    println!(
        "\n| case | backward chunk rows | O err / naive | dQ err / naive | dK err / naive | dV err / naive | LSE rel err | result |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (_, line, _) in &rows {
        println!("{line}");
    }
    let failed: Vec<_> = rows.iter().filter(|r| !r.2).map(|r| r.1.clone()).collect();
    println!("{} cases, {} failed", rows.len(), failed.len());
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

#[cfg(feature = "cuda")]
#[test]
fn forward_is_bitwise_deterministic_and_matches_the_stream_path_and_a_graph_replay() {
    use attn_policy_adapters::{DeviceForwardArgs, DeviceIo, StreamLaunch};
    let Some(ex) = gpu() else { return };
    let seed = fresh_seed();
    let bufs = ex.buffers();
    let p = AttentionProblem::new(2, 8, 2, 1000, 1300, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let q = bufs.random(p.dtype, p.q_span(), seed).unwrap();
    let k = bufs.random(p.dtype, p.k_span(), seed + 1).unwrap();
    let v = bufs.random(p.dtype, p.v_span(), seed + 2).unwrap();
    let outs = || {
        let o = bufs.alloc(2 * p.o_span()).unwrap();
        let lse = bufs.alloc(4 * p.lse_len()).unwrap();
        bufs.poison(&o, 0xFF).unwrap();
        bufs.poison(&lse, 0xFF).unwrap();
        (o, lse)
    };
    let args = |o: &attn_policy_adapters::chunked::DeviceBuffer,
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
    let plan = ex.plan(&p, Direction::Forward).unwrap();
    let read = |o: &attn_policy_adapters::chunked::DeviceBuffer,
                l: &attn_policy_adapters::chunked::DeviceBuffer| {
        (
            bufs.download_u16(o, p.o_span()).unwrap(),
            bufs.download_f32(l, p.lse_len())
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
        )
    };
    let (o1, l1) = outs();
    let (o2, l2) = outs();
    let (o3, l3) = outs();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.run_device(&args(&o1, &l1)) }.unwrap();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.run_device(&args(&o2, &l2)) }.unwrap();
    let first = read(&o1, &l1);
    assert!(first.0.iter().any(|&x| x != 0), "O is all zeros");
    assert_eq!(first, read(&o2, &l2), "two forward runs differ");

    // A stream the executor does not own, as a framework's would be.
    let (side, _ws, launch) = foreign_launch(&ex, plan.as_ref());
    let ws_bytes = launch.workspace_bytes;
    let refused = |l: &StreamLaunch| {
        matches!(
            // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
            unsafe { plan.enqueue(&args(&o3, &l3), l) },
            Err(ExecError::InvalidInput { .. })
        )
    };
    assert!(refused(&StreamLaunch {
        device: 7,
        ..launch
    }));
    assert!(refused(&StreamLaunch {
        workspace_bytes: ws_bytes - 256,
        ..launch
    }));
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.enqueue(&args(&o3, &l3), &launch) }.unwrap();
    side.synchronize().unwrap();
    assert_eq!(first, read(&o3, &l3), "stream path differs");

    // The same call captured in a CUDA graph (after the warm-up above) and replayed twice.
    bufs.poison(&o3, 0xFF).unwrap();
    bufs.poison(&l3, 0xFF).unwrap();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    replay_twice_in_a_graph(&side, || unsafe { plan.enqueue(&args(&o3, &l3), &launch) });
    assert_eq!(first, read(&o3, &l3), "graph replay differs");
}

/// A stream the executor does not own (as a framework's would be) and a workspace for `plan`.
#[cfg(feature = "cuda")]
fn foreign_launch(
    ex: &Fused,
    plan: &dyn attn_policy_adapters::Plan,
) -> (
    std::sync::Arc<cudarc::driver::CudaStream>,
    attn_policy_adapters::chunked::DeviceBuffer,
    attn_policy_adapters::StreamLaunch,
) {
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    let side = ctx.new_stream().unwrap();
    let ws_bytes = plan.workspace_bytes().unwrap();
    let ws = ex.buffers().alloc(ws_bytes as usize).unwrap();
    let launch = attn_policy_adapters::StreamLaunch {
        device: 0,
        stream: side.cu_stream() as u64,
        workspace: ws.ptr(),
        workspace_bytes: ws_bytes,
    };
    (side, ws, launch)
}

/// Captures `enqueue` on `stream` in a CUDA graph, replays it twice and waits.
#[cfg(feature = "cuda")]
fn replay_twice_in_a_graph(
    stream: &cudarc::driver::CudaStream,
    enqueue: impl FnOnce() -> Result<(), ExecError>,
) {
    use cudarc::driver::sys as drv;
    let raw = stream.cu_stream();
    let mut graph: drv::CUgraph = std::ptr::null_mut();
    let mut exec: drv::CUgraphExec = std::ptr::null_mut();
    // SAFETY: raw driver calls on this test's own live stream, graph and exec handles, each created before use and destroyed once.
    unsafe {
        drv::cuStreamBeginCapture_v2(raw, drv::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .result()
            .unwrap();
        let enqueued = enqueue();
        drv::cuStreamEndCapture(raw, &mut graph).result().unwrap();
        enqueued.expect("enqueue during capture");
        drv::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        for _ in 0..2 {
            drv::cuGraphLaunch(exec, raw).result().unwrap();
        }
    }
    stream.synchronize().unwrap();
    // SAFETY: raw driver calls on this test's own live stream, graph and exec handles, each created before use and destroyed once.
    unsafe {
        drv::cuGraphExecDestroy(exec).result().unwrap();
        drv::cuGraphDestroy(graph).result().unwrap();
    }
}

#[test]
fn refusals_come_before_any_launch() {
    let Some(ex) = gpu() else { return };
    let p = AttentionProblem::new(1, 4, 2, 64, 64, 512, 512, DType::BF16);
    let inp = random_inputs(&p, 3);
    let fwd = |p: &AttentionProblem, q: &HostTensor| {
        run_forward(
            &ex,
            p,
            &ForwardInputs {
                q,
                k: &inp.k,
                v: &inp.v,
                sink: None,
            },
        )
    };
    // Outside the manifest: typed Unsupported, nothing compiled or launched.
    for (bad, why) in [
        (
            AttentionProblem::new(1, 4, 2, 64, 64, 256, 256, DType::BF16),
            "head_dim_qk 256",
        ),
        (
            AttentionProblem::new(1, 4, 2, 64, 64, 520, 520, DType::BF16),
            "head_dim_qk 520",
        ),
        (
            AttentionProblem::new(1, 4, 2, 64, 64, 512, 512, DType::F32),
            "dtype",
        ),
    ] {
        let e = ex.check(&bad).unwrap_err();
        assert!(e.reason.contains(why), "{why}: {}", e.reason);
        assert!(matches!(
            ex.plan(&bad, Direction::Forward),
            Err(ExecError::Unsupported { .. })
        ));
    }
    let wrong = HostTensor {
        dtype: DType::F16,
        data: inp.q.data.clone(),
    };
    assert!(matches!(
        fwd(&p, &wrong),
        Err(ExecError::InvalidInput { .. })
    ));
    let short = HostTensor {
        dtype: DType::BF16,
        data: inp.q.data[..100].to_vec(),
    };
    assert!(matches!(
        fwd(&p, &short),
        Err(ExecError::InvalidInput { .. })
    ));
    // The backward checks its inputs the same way: wrong lengths are refused, typed.
    let f = fwd(&p, &inp.q).unwrap();
    let e = run_backward(
        &ex,
        &p,
        &BackwardInputs {
            q: &inp.q,
            k: &inp.k,
            v: &inp.v,
            o: &f.o,
            d_o: &short,
            lse: &f.lse,
            sink: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::InvalidInput { .. }), "{e}");
    assert!(
        ex.plan(
            &AttentionProblem::new(1, 4, 2, 64, 64, 256, 256, DType::BF16),
            Direction::Backward
        )
        .unwrap_err()
        .is_unsupported()
    );
}

#[cfg(feature = "cuda")]
#[test]
fn backward_is_bitwise_deterministic_and_matches_the_stream_path_and_a_graph_replay() {
    use attn_policy_adapters::chunked::DeviceBuffer;
    use attn_policy_adapters::{DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, StreamLaunch};
    // Small chunks: several chunks, each several score tiles.
    let Some(ex) = gpu_with(ChunkedConfig {
        max_chunk_rows: 384,
        target_rows_per_gemm: 384,
        ..Default::default()
    }) else {
        return;
    };
    let seed = fresh_seed();
    let bufs = ex.buffers();
    let p = AttentionProblem::new(2, 8, 2, 1000, 1300, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let q = bufs.random(p.dtype, p.q_span(), seed).unwrap();
    let k = bufs.random(p.dtype, p.k_span(), seed + 1).unwrap();
    let v = bufs.random(p.dtype, p.v_span(), seed + 2).unwrap();
    let d_o = bufs.random(p.dtype, p.o_span(), seed + 3).unwrap();
    let o = bufs.alloc(2 * p.o_span()).unwrap();
    let lse = bufs.alloc(4 * p.lse_len()).unwrap();
    let fa = DeviceForwardArgs {
        q: q.ptr(),
        k: k.ptr(),
        v: v.ptr(),
        o: o.ptr(),
        lse: lse.ptr(),
        sink: 0,
    };
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe {
        ex.plan(&p, Direction::Forward)
            .unwrap()
            .run_device(&DeviceIo::Forward(fa))
    }
    .unwrap();
    let grads = || {
        let g = [
            bufs.alloc(2 * p.q_span()).unwrap(),
            bufs.alloc(2 * p.k_span()).unwrap(),
            bufs.alloc(2 * p.v_span()).unwrap(),
        ];
        for b in &g {
            bufs.poison(b, 0xFF).unwrap();
        }
        g
    };
    let args = |g: &[DeviceBuffer; 3]| {
        DeviceIo::Backward(DeviceBackwardArgs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            o: o.ptr(),
            d_o: d_o.ptr(),
            lse: lse.ptr(),
            dq: g[0].ptr(),
            dk: g[1].ptr(),
            dv: g[2].ptr(),
            sink: 0,
            d_sink: 0,
        })
    };
    let plan = ex.plan(&p, Direction::Backward).unwrap();
    let read = |g: &[DeviceBuffer; 3]| {
        [
            bufs.download_u16(&g[0], p.q_span()).unwrap(),
            bufs.download_u16(&g[1], p.k_span()).unwrap(),
            bufs.download_u16(&g[2], p.v_span()).unwrap(),
        ]
    };
    let (g1, g2, g3) = (grads(), grads(), grads());
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.run_device(&args(&g1)) }.unwrap();
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.run_device(&args(&g2)) }.unwrap();
    let first = read(&g1);
    for (g, name) in first.iter().zip(["dQ", "dK", "dV"]) {
        assert!(g.iter().any(|&x| x != 0), "{name} is all zeros");
        assert!(!g.contains(&0xFFFF), "{name} has unwritten elements");
    }
    assert_eq!(first, read(&g2), "two backward runs differ");

    let (side, _ws, launch) = foreign_launch(&ex, plan.as_ref());
    let ws_bytes = launch.workspace_bytes;
    assert!(matches!(
        // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
        unsafe {
            plan.enqueue(
                &args(&g3),
                &StreamLaunch {
                    workspace_bytes: ws_bytes - 256,
                    ..launch
                },
            )
        },
        Err(ExecError::InvalidInput { .. })
    ));
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    unsafe { plan.enqueue(&args(&g3), &launch) }.unwrap();
    side.synchronize().unwrap();
    assert_eq!(first, read(&g3), "stream path differs");

    for b in &g3 {
        bufs.poison(b, 0xFF).unwrap();
    }
    // SAFETY: every buffer was allocated on this device for this problem's spans and lives to the end of the test; the call synchronises or the stream is synchronised before reading.
    replay_twice_in_a_graph(&side, || unsafe { plan.enqueue(&args(&g3), &launch) });
    assert_eq!(first, read(&g3), "graph replay differs");
}
