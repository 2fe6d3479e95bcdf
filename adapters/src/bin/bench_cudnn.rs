//! Speed of the `cudnn` executor (b2 hq8 hkv4 causal bf16, bhsd like PyTorch's tensors), and the
//! host overhead of a plan-cache hit. Prints a table; `--json PATH` also writes the rows.
//!
//! Usage: bench_cudnn [--iters N] [--json PATH]

use std::time::Instant;

use attn_policy_adapters::cudnn::{CudnnExecutor, Direction, IoPtrs};
use attn_policy_adapters::{AttentionProblem, DType, Executor, LayoutKind, MaskSpec};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys};

struct Buffers {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    o: CudaSlice<u16>,
    d_o: CudaSlice<u16>,
    lse: CudaSlice<f32>,
    dq: CudaSlice<u16>,
    dk: CudaSlice<u16>,
    dv: CudaSlice<u16>,
}

fn random_bits(n: usize, seed: u64, dtype: DType) -> Vec<u16> {
    let mut rng = attn_policy_adapters::rng::Rng::new(seed);
    (0..n).map(|_| dtype.to_bits(rng.normal())).collect()
}

fn buffers(s: &std::sync::Arc<CudaStream>, p: &AttentionProblem) -> Buffers {
    let dt = p.dtype;
    Buffers {
        q: s.clone_htod(&random_bits(p.q_span(), 1, dt)).unwrap(),
        k: s.clone_htod(&random_bits(p.k_span(), 2, dt)).unwrap(),
        v: s.clone_htod(&random_bits(p.v_span(), 3, dt)).unwrap(),
        o: s.alloc_zeros(p.o_span()).unwrap(),
        d_o: s.clone_htod(&random_bits(p.o_span(), 4, dt)).unwrap(),
        lse: s.alloc_zeros(p.lse_len()).unwrap(),
        dq: s.alloc_zeros(p.q_span()).unwrap(),
        dk: s.alloc_zeros(p.k_span()).unwrap(),
        dv: s.alloc_zeros(p.v_span()).unwrap(),
    }
}

fn ptrs(b: &mut Buffers, s: &CudaStream) -> IoPtrs {
    // The guards only record events for cudarc's own stream tracking; the buffers outlive the runs.
    IoPtrs {
        q: b.q.device_ptr(s).0,
        k: b.k.device_ptr(s).0,
        v: b.v.device_ptr(s).0,
        o: b.o.device_ptr_mut(s).0,
        lse: b.lse.device_ptr_mut(s).0,
        d_o: b.d_o.device_ptr(s).0,
        dq: b.dq.device_ptr_mut(s).0,
        dk: b.dk.device_ptr_mut(s).0,
        dv: b.dv.device_ptr_mut(s).0,
    }
}

/// Median over `reps` of (events around `iters` back-to-back calls) / iters, in ms.
fn time_ms(
    ex: &CudnnExecutor,
    s: &std::sync::Arc<CudaStream>,
    p: &AttentionProblem,
    dir: Direction,
    io: &IoPtrs,
    iters: usize,
) -> f64 {
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    for _ in 0..3 {
        // SAFETY: buffers of the problem's spans, alive for the whole bench.
        unsafe { ex.enqueue(p, dir, io, s) }.expect("warm-up");
    }
    s.synchronize().unwrap();
    let mut per = Vec::new();
    for _ in 0..5 {
        let a = s.record_event(flags).unwrap();
        for _ in 0..iters {
            // SAFETY: as above.
            unsafe { ex.enqueue(p, dir, io, s) }.expect("run");
        }
        let b = s.record_event(flags).unwrap();
        b.synchronize().unwrap();
        per.push(a.elapsed_ms(&b).unwrap() as f64 / iters as f64);
    }
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters = args
        .iter()
        .position(|a| a == "--iters")
        .map(|i| args[i + 1].parse().unwrap())
        .unwrap_or(20usize);
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .map(|i| args[i + 1].clone());
    let ex = match CudnnExecutor::new(0) {
        Ok(e) => std::sync::Arc::new(e),
        Err(e) => {
            eprintln!("no GPU/cuDNN: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "cudnnGetVersion() = {}; {}",
        ex.version().0,
        ex.device_description()
    );
    let s = ex.stream().clone();
    let mut rows = Vec::new();
    println!(
        "{:>4} {:>6} {:>5} | {:>9} {:>8} | {:>9} {:>8} | {:>10} | engines",
        "d", "s", "det", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "fwd+bwd ms"
    );
    for d in [128usize, 256] {
        for seq in [4096usize, 16384] {
            for det in [false, true] {
                let mut p = AttentionProblem::new(2, 8, 4, seq, seq, d, d, DType::BF16)
                    .with_mask(MaskSpec::CAUSAL_TOP_LEFT)
                    .with_layout(LayoutKind::Bhsd);
                p.deterministic = det;
                let mut b = buffers(&s, &p);
                let io = ptrs(&mut b, &s);
                let fwd = time_ms(&ex, &s, &p, Direction::Forward, &io, iters);
                let (bwd, beng) = match ex.plan_info(&p, Direction::Backward) {
                    Ok((_, e)) => (
                        Some(time_ms(&ex, &s, &p, Direction::Backward, &io, iters)),
                        e.tag.clone(),
                    ),
                    Err(e) => (None, format!("bwd refused: {e}")),
                };
                let (_, feng) = ex.plan_info(&p, Direction::Forward).expect("fwd plan");
                let ftf = p.forward_flops() / (fwd * 1e-3) / 1e12;
                let btf = bwd.map(|t| p.backward_flops() / (t * 1e-3) / 1e12);
                println!(
                    "{:>4} {:>6} {:>5} | {:>9.3} {:>8.0} | {:>9} {:>8} | {:>10} | {} / {}",
                    d,
                    seq,
                    det,
                    fwd,
                    ftf,
                    bwd.map_or("-".into(), |t| format!("{t:.3}")),
                    btf.map_or("-".into(), |t| format!("{t:.0}")),
                    bwd.map_or("-".into(), |t| format!("{:.3}", fwd + t)),
                    feng.tag,
                    beng
                );
                rows.push(format!(
                    "{{\"d\":{d},\"s\":{seq},\"deterministic\":{det},\"fwd_ms\":{fwd},\"bwd_ms\":{},\"fwd_engine\":\"{}\",\"bwd_engine\":\"{}\"}}",
                    bwd.map_or("null".into(), |t| t.to_string()),
                    feng.summary(),
                    beng
                ));
                drop(b);
            }
        }
    }

    // Host overhead of a plan-cache hit: a small problem, many enqueues, host time per call.
    let p = AttentionProblem::new(1, 1, 1, 128, 128, 64, 64, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    let mut b = buffers(&s, &p);
    let io = ptrs(&mut b, &s);
    for _ in 0..10 {
        // SAFETY: buffers of the problem's spans.
        unsafe { ex.enqueue(&p, Direction::Forward, &io, &s) }.unwrap();
    }
    s.synchronize().unwrap();
    let mut host = Vec::new();
    let mut wall = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        // SAFETY: as above.
        let r = unsafe { ex.enqueue(&p, Direction::Forward, &io, &s) }.unwrap();
        wall.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(r.cache_hit);
        host.push(r.host_us);
        if i % 100 == 99 {
            s.synchronize().unwrap();
        }
    }
    s.synchronize().unwrap();
    host.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    let pct = |v: &[f64], q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    println!(
        "plan-cache hit host overhead per call (check, lookup, cudnnSetStream, workspace alloc/free, variant pack, cudnnBackendExecute): median {:.1} us, p90 {:.1} us (wall around enqueue: median {:.1} us); cache {:?}",
        pct(&host, 0.5),
        pct(&host, 0.9),
        pct(&wall, 0.5),
        ex.cache_stats()
    );
    rows.push(format!(
        "{{\"host_overhead_us_median\":{},\"host_overhead_us_p90\":{}}}",
        pct(&host, 0.5),
        pct(&host, 0.9)
    ));
    if let Some(path) = json_path {
        std::fs::write(&path, format!("[{}]\n", rows.join(",\n"))).expect("write json");
    }
}
