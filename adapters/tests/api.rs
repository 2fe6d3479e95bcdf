//! CPU tests of the adapter API: the reference oracle, the registry, `run_random`, and the
//! manifests' refusals.

use attn_policy_adapters::reference::{self, backward_f64, forward_f64};
use attn_policy_adapters::rng::Rng;
use attn_policy_adapters::trial::{RunOptions, VerifyMode, run_random};
use attn_policy_adapters::{
    AttentionProblem, DType, DiagonalAlignment, ExecError, LayoutKind, MaskSpec, Registry, Strides,
};

fn randn(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal()).collect()
}

/// sum(O * dO): its gradient is what backward returns for upstream gradient dO.
fn loss(p: &AttentionProblem, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> f64 {
    let (o, _) = forward_f64(p, q, k, v);
    o.iter().zip(d_o).map(|(a, b)| a * b).sum()
}

#[test]
fn reference_backward_matches_finite_differences() {
    let masks = [
        MaskSpec::NONE,
        MaskSpec::CAUSAL_TOP_LEFT,
        MaskSpec::CAUSAL_BOTTOM_RIGHT,
        MaskSpec::window(2, 1, DiagonalAlignment::BottomRight),
    ];
    for (mi, mask) in masks.into_iter().enumerate() {
        let p = AttentionProblem::new(1, 4, 2, 5, 7, 3, 2, DType::BF16)
            .with_mask(mask)
            .with_layout(LayoutKind::Sbhd);
        let seed = 10 * mi as u64;
        let (q, k, v, d_o) = (
            randn(p.q_span(), seed),
            randn(p.k_span(), seed + 1),
            randn(p.v_span(), seed + 2),
            randn(p.o_span(), seed + 3),
        );
        let (dq, dk, dv) = backward_f64(&p, &q, &k, &v, &d_o);
        let eps = 1e-6;
        let fd = |which: usize, i: usize| {
            let mut t = [q.clone(), k.clone(), v.clone()];
            t[which][i] += eps;
            let up = loss(&p, &t[0], &t[1], &t[2], &d_o);
            t[which][i] -= 2.0 * eps;
            let dn = loss(&p, &t[0], &t[1], &t[2], &d_o);
            (up - dn) / (2.0 * eps)
        };
        for (which, grad) in [(0usize, &dq), (1, &dk), (2, &dv)] {
            for (i, g) in grad.iter().enumerate() {
                let want = fd(which, i);
                assert!(
                    (g - want).abs() < 1e-6,
                    "mask {mi} tensor {which} elem {i}: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn reference_gqa_equals_expanded_mha_and_masks_agree() {
    let p =
        AttentionProblem::new(2, 4, 2, 9, 9, 8, 8, DType::F16).with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    let (q, k, v) = (
        randn(p.q_span(), 1),
        randn(p.k_span(), 2),
        randn(p.v_span(), 3),
    );
    let (o, lse) = forward_f64(&p, &q, &k, &v);
    // Expand K/V to MHA (bshd): head h reads KV head h / 2.
    let mut m = p.clone();
    m.heads_kv = 4;
    m.set_layout(LayoutKind::Bshd);
    let expand = |x: &[f64]| {
        let mut out = vec![0.0; m.k_span()];
        for b in 0..2 {
            for s in 0..9 {
                for h in 0..4 {
                    for d in 0..8 {
                        out[m.layout.k.offset(b, h, s, d)] = x[p.layout.k.offset(b, h / 2, s, d)];
                    }
                }
            }
        }
        out
    };
    let (o2, lse2) = forward_f64(&m, &q, &expand(&k), &expand(&v));
    assert!(o.iter().zip(&o2).all(|(a, b)| (a - b).abs() < 1e-12));
    assert!(lse.iter().zip(&lse2).all(|(a, b)| (a - b).abs() < 1e-12));
    // Square: bottom-right causal == top-left causal.
    let br = p.clone().with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let (o3, _) = forward_f64(&br, &q, &k, &v);
    assert!(o.iter().zip(&o3).all(|(a, b)| (a - b).abs() < 1e-12));
}

#[test]
fn fully_masked_rows_give_zero_output_and_neg_inf_lse() {
    // s_q > s_kv with bottom-right causal: the first s_q - s_kv rows see no key.
    let p = AttentionProblem::new(1, 1, 1, 6, 3, 4, 4, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT);
    let (o, lse) = forward_f64(
        &p,
        &randn(p.q_span(), 5),
        &randn(p.k_span(), 6),
        &randn(p.v_span(), 7),
    );
    for i in 0..3 {
        assert_eq!(lse[i], f64::NEG_INFINITY);
        assert!(o[i * 4..i * 4 + 4].iter().all(|&x| x == 0.0));
    }
    assert!(lse[3..].iter().all(|x| x.is_finite()));
}

#[test]
fn run_reference_verifies_small_problems() {
    let p = AttentionProblem::new(1, 4, 2, 128, 128, 64, 64, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    let r = run_random("reference", &p, 42, &RunOptions::default()).unwrap();
    assert_eq!(r.executor, "reference");
    assert!(r.backward_ms.is_some());
    let v = r.verification.expect("small problem is verified");
    assert!(v.passed, "{v:?}");
    assert_eq!(v.checks.len(), 4);
    assert!(r.device.contains("CPU"));
}

#[test]
fn run_skips_verification_when_too_large_and_says_why() {
    let p = AttentionProblem::new(1, 1, 1, 64, 64, 8, 8, DType::F16);
    let opts = RunOptions {
        verify_max_score_elements: 100,
        backward: false,
        ..Default::default()
    };
    let r = run_random("reference", &p, 1, &opts).unwrap();
    assert!(r.verification.is_none());
    assert!(r.verification_skipped.unwrap().contains("too large"));
    let never = RunOptions {
        verify: VerifyMode::Never,
        ..opts
    };
    assert!(
        run_random("reference", &p, 1, &never)
            .unwrap()
            .verification
            .is_none()
    );
}

#[test]
fn registry_knows_builtins_and_refuses_unknown_names() {
    let r = Registry::builtin();
    let names = r.names();
    assert!(
        names.contains(&"reference") && names.contains(&"chunked"),
        "{names:?}"
    );
    let e = r.get("flash9").err().expect("unknown executor");
    assert!(matches!(e, ExecError::UnknownExecutor { .. }), "{e}");
    // Manifests need no device.
    assert!(r.manifest("chunked").unwrap().gqa);
}

#[test]
fn chunked_refusals_are_typed_and_need_no_device() {
    let m = attn_policy_adapters::chunked::manifest();
    let ok = AttentionProblem::new(2, 8, 4, 16384, 16384, 512, 512, DType::BF16)
        .with_mask(MaskSpec::CAUSAL_TOP_LEFT);
    assert!(m.admits(&ok).is_ok());
    assert!(attn_policy_adapters::chunked::check_problem(&ok).is_ok());
    let d12 = AttentionProblem::new(1, 2, 2, 64, 64, 12, 12, DType::BF16);
    assert!(m.admits(&d12).unwrap_err().reason.contains("head_dim_qk"));
    let mut odd = AttentionProblem::new(1, 2, 2, 64, 64, 64, 64, DType::BF16);
    odd.layout.q = Strides {
        batch: 64 * 2 * 68,
        head: 68,
        seq: 2 * 68 + 4,
    };
    assert!(
        m.admits(&odd)
            .unwrap_err()
            .reason
            .contains("multiples of 8")
    );
    let gqa_bad = AttentionProblem::new(1, 6, 4, 64, 64, 64, 64, DType::BF16);
    assert!(
        m.admits(&gqa_bad)
            .unwrap_err()
            .reason
            .contains("multiple of heads_kv")
    );
    // The reference admits what chunked admits, for this sample (a pack may fall back to it).
    assert!(
        reference::manifest()
            .admits(&AttentionProblem::new(1, 2, 1, 64, 80, 24, 16, DType::F16))
            .is_ok()
    );
}

#[test]
fn chunked_without_gpu_is_an_error_not_a_silent_fallback() {
    let p = AttentionProblem::new(1, 2, 2, 64, 64, 64, 64, DType::BF16);
    match run_random("chunked", &p, 1, &RunOptions::default()) {
        Err(ExecError::NoDevice { reason }) => println!("chunked unavailable here: {reason}"),
        Ok(r) => {
            // On a GPU machine with the cuda feature it runs for real.
            assert_eq!(r.executor, "chunked");
            assert!(r.verification.expect("verified").passed);
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn manifests_serialize_for_pack_cross_checks() {
    let ms = Registry::builtin().manifests();
    assert!(ms.len() >= 2);
    let json = serde_json::to_string(&ms).unwrap();
    assert!(json.contains("\"name\":\"chunked\"") && json.contains("\"stride_multiple_of\":8"));
    let back: Vec<attn_policy_adapters::Manifest> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, ms);
}

/// Strides of a tensor `[b, h, s, d]` stored inside a larger, padded buffer (rows longer than
/// `d`, heads farther apart): what a framework view of a packed QKV tensor looks like.
fn padded(h: usize, s: usize, d: usize) -> Strides {
    let seq = h * (d + 3);
    Strides {
        batch: s * seq + 5,
        head: d + 3,
        seq,
    }
}

#[test]
fn strided_reference_runs_every_dtype_on_padded_views_and_matches_float64() {
    for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
        for mask in [
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            MaskSpec::window(3, 0, DiagonalAlignment::TopLeft),
        ] {
            let (b, hq, hkv, sq, skv, dqk, dv) = (2, 4, 2, 5, 9, 6, 4);
            let mut p = AttentionProblem::new(b, hq, hkv, sq, skv, dqk, dv, dtype).with_mask(mask);
            p.layout.q = padded(hq, sq, dqk);
            p.layout.k = padded(hkv, skv, dqk);
            p.layout.v = padded(hkv, skv, dv);
            p.layout.o = padded(hq, sq, dv);
            p.validate().unwrap();
            // Values exactly representable in every dtype (multiples of 1/64, |x| < 4), so the
            // strided call and the float64 oracle see the same inputs.
            let quant = |n: usize, seed: u64| -> Vec<f64> {
                randn(n, seed)
                    .iter()
                    .map(|x| (x.clamp(-3.9, 3.9) * 64.0).round() / 64.0)
                    .collect()
            };
            let enc = |x: &[f64]| -> Vec<u8> {
                x.iter()
                    .flat_map(|&v| match dtype {
                        DType::F64 => v.to_le_bytes().to_vec(),
                        DType::F32 => (v as f32).to_le_bytes().to_vec(),
                        _ => dtype.to_bits(v).to_le_bytes().to_vec(),
                    })
                    .collect()
            };
            let dec = |x: &[u8]| -> Vec<f64> {
                x.chunks(dtype.size_bytes())
                    .map(|c| match dtype {
                        DType::F64 => f64::from_le_bytes(c.try_into().unwrap()),
                        DType::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
                        _ => dtype.from_bits(u16::from_le_bytes(c.try_into().unwrap())),
                    })
                    .collect()
            };
            let (q, k, v, d_o) = (
                quant(p.q_span(), 1),
                quant(p.k_span(), 2),
                quant(p.v_span(), 3),
                quant(p.o_span(), 4),
            );
            let (qb, kb, vb, dob) = (enc(&q), enc(&k), enc(&v), enc(&d_o));
            // Outputs start as a sentinel: padding must stay untouched.
            let sentinel = 7.0;
            let mut ob = enc(&vec![sentinel; p.o_span()]);
            let mut lse = vec![0f32; p.lse_len()];
            // SAFETY: the host buffers were sized from the problem's spans (q/k/v/o_span, lse_len) just above and outlive the call.
            unsafe {
                reference::forward_strided(
                    &p,
                    qb.as_ptr(),
                    kb.as_ptr(),
                    vb.as_ptr(),
                    ob.as_mut_ptr(),
                    lse.as_mut_ptr(),
                )
            }
            .unwrap();
            let (o_ref, lse_ref) = forward_f64(&p, &q, &k, &v);
            let o = dec(&ob);
            let tol = match dtype {
                DType::F64 => 1e-12,
                DType::F32 => 1e-6,
                _ => 1e-2,
            };
            for bi in 0..b {
                for h in 0..hq {
                    for s in 0..sq {
                        for d in 0..dv {
                            let i = p.layout.o.offset(bi, h, s, d);
                            assert!((o[i] - o_ref[i]).abs() <= tol, "{dtype} o[{i}]");
                        }
                    }
                }
            }
            let written: std::collections::HashSet<usize> = (0..b)
                .flat_map(|bi| {
                    (0..hq).flat_map(move |h| {
                        (0..sq).flat_map(move |s| (0..dv).map(move |d| (bi, h, s, d)))
                    })
                })
                .map(|(bi, h, s, d)| p.layout.o.offset(bi, h, s, d))
                .collect();
            for (i, x) in o.iter().enumerate() {
                if !written.contains(&i) {
                    assert_eq!(*x, sentinel, "{dtype}: padding element {i} written");
                }
            }
            for (g, w) in lse.iter().zip(&lse_ref) {
                assert!(
                    (*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{dtype} lse"
                );
            }
            let (mut dqb, mut dkb, mut dvb) = (
                enc(&vec![0.0; p.q_span()]),
                enc(&vec![0.0; p.k_span()]),
                enc(&vec![0.0; p.v_span()]),
            );
            // SAFETY: the host buffers were sized from the problem's spans (q/k/v/o_span, lse_len) just above and outlive the call.
            unsafe {
                reference::backward_strided(
                    &p,
                    qb.as_ptr(),
                    kb.as_ptr(),
                    vb.as_ptr(),
                    dob.as_ptr(),
                    dqb.as_mut_ptr(),
                    dkb.as_mut_ptr(),
                    dvb.as_mut_ptr(),
                )
            }
            .unwrap();
            let (gq, gk, gv) = backward_f64(&p, &q, &k, &v, &d_o);
            for (name, got, want, st, dims) in [
                ("dq", dec(&dqb), gq, p.layout.q, (b, hq, sq, dqk)),
                ("dk", dec(&dkb), gk, p.layout.k, (b, hkv, skv, dqk)),
                ("dv", dec(&dvb), gv, p.layout.v, (b, hkv, skv, dv)),
            ] {
                for bi in 0..dims.0 {
                    for h in 0..dims.1 {
                        for s in 0..dims.2 {
                            for d in 0..dims.3 {
                                let i = st.offset(bi, h, s, d);
                                let tol = tol * want[i].abs().max(1.0) * 4.0;
                                assert!(
                                    (got[i] - want[i]).abs() <= tol,
                                    "{dtype} {name}[{i}]: {} vs {}",
                                    got[i],
                                    want[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn wide_dtypes_are_refused_on_the_host_tensor_path_not_approximated() {
    let p = AttentionProblem::new(1, 2, 2, 4, 4, 8, 8, DType::F32);
    let err = run_random("reference", &p, 0, &RunOptions::default()).unwrap_err();
    assert!(
        matches!(&err, ExecError::InvalidInput { reason } if reason.contains("forward_strided")),
        "{err}"
    );
    // GPU executors' manifests take 16-bit types only.
    let r = Registry::builtin();
    for name in ["chunked", "fused", "cudnn", "frost", "torch_flash"] {
        let m = r.manifest(name).unwrap();
        assert!(m.admits(&p).is_err(), "{name} admits fp32");
    }
    assert!(r.manifest("reference").unwrap().admits(&p).is_ok());
    assert!(r.manifest("torch_math").unwrap().admits(&p).is_ok());
}
