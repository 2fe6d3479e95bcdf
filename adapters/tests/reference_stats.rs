//! The reference backward from given statistics (O and LSE), the form a context-parallel ring
//! step needs: with the call's own statistics it is the exact gradient; with the statistics of a
//! larger softmax whose keys were split into blocks, each block's call gives that softmax's
//! gradient restricted to the block. Also the fp64 LSE of the strided path.

use attn_policy_adapters::reference::{
    self, LseIn, LseOut, backward_f64, backward_f64_from_stats, forward_f64,
};
use attn_policy_adapters::rng::Rng;
use attn_policy_adapters::{AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskSpec};

fn randn(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal()).collect()
}

fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * scale,
            "{name}[{i}]: {a} vs {b} (max |want| {scale})"
        );
    }
}

fn problems() -> Vec<AttentionProblem> {
    let mut out = Vec::new();
    // (b, hq, hkv, sq, skv, d, dv, mask)
    let masks = [
        MaskSpec::NONE,
        MaskSpec::CAUSAL_TOP_LEFT,
        MaskSpec::CAUSAL_BOTTOM_RIGHT,
        MaskSpec {
            window_left: 3,
            ..MaskSpec::CAUSAL_TOP_LEFT
        },
        MaskSpec::window(2, 1, DiagonalAlignment::BottomRight),
    ];
    for (i, mask) in masks.into_iter().enumerate() {
        // s_q > s_kv with a bottom-right diagonal leaves the first rows without keys.
        let (sq, skv) = if i % 2 == 0 { (9, 5) } else { (6, 11) };
        let mut p = AttentionProblem::new(2, 4, 2, sq, skv, 8, 6, DType::F64);
        p.mask = mask;
        p.validate().unwrap();
        out.push(p);
    }
    out
}

#[test]
fn from_own_statistics_equals_the_recomputing_backward() {
    for (n, p) in problems().iter().enumerate() {
        let s = 10 * n as u64;
        let (q, k, v, d_o) = (
            randn(p.q_span(), s + 1),
            randn(p.k_span(), s + 2),
            randn(p.v_span(), s + 3),
            randn(p.o_span(), s + 4),
        );
        let (o, lse) = forward_f64(p, &q, &k, &v);
        assert!(
            lse.contains(&f64::NEG_INFINITY) == (n % 2 == 0 && n != 0),
            "problem {n}: rows without keys where expected"
        );
        let want = backward_f64(p, &q, &k, &v, &d_o);
        let got = backward_f64_from_stats(p, &q, &k, &v, &o, &lse, &d_o);
        assert_close("dq", &got.0, &want.0, 1e-12);
        assert_close("dk", &got.1, &want.1, 1e-12);
        assert_close("dv", &got.2, &want.2, 1e-12);
    }
}

/// Keys [0, skv) split into [0, cut) and [cut, skv): each block's call with the whole softmax's
/// O and LSE gives the whole gradient's dK/dV rows of the block, and the blocks' dQ add up.
#[test]
fn a_key_block_with_the_whole_softmax_statistics() {
    let (b, hq, hkv, sq, skv, d, cut) = (1, 4, 2, 5, 12, 8, 7);
    let whole =
        AttentionProblem::new(b, hq, hkv, sq, skv, d, d, DType::F64).with_layout(LayoutKind::Bhsd);
    let (q, k, v, d_o) = (
        randn(whole.q_span(), 1),
        randn(whole.k_span(), 2),
        randn(whole.v_span(), 3),
        randn(whole.o_span(), 4),
    );
    let (o, lse) = forward_f64(&whole, &q, &k, &v);
    let (dq, dk, dv) = backward_f64(&whole, &q, &k, &v, &d_o);
    // Contiguous bhsd: the keys of a block are rows [lo, hi) of every (batch, head).
    let rows = |x: &[f64], lo: usize, hi: usize| -> Vec<f64> {
        (0..b * hkv)
            .flat_map(|bh| x[(bh * skv + lo) * d..(bh * skv + hi) * d].to_vec())
            .collect()
    };
    let mut dq_sum = vec![0.0; dq.len()];
    for (lo, hi) in [(0, cut), (cut, skv)] {
        let p = AttentionProblem::new(b, hq, hkv, sq, hi - lo, d, d, DType::F64)
            .with_layout(LayoutKind::Bhsd);
        let (kb, vb) = (rows(&k, lo, hi), rows(&v, lo, hi));
        let (gq, gk, gv) = backward_f64_from_stats(&p, &q, &kb, &vb, &o, &lse, &d_o);
        assert_close("dk block", &gk, &rows(&dk, lo, hi), 1e-12);
        assert_close("dv block", &gv, &rows(&dv, lo, hi), 1e-12);
        for (a, x) in dq_sum.iter_mut().zip(gq) {
            *a += x;
        }
        // The recomputing backward normalises over the block's keys only: not the same.
        let (_, gk_local, _) = backward_f64(&p, &q, &kb, &vb, &d_o);
        let diff = gk_local
            .iter()
            .zip(rows(&dk, lo, hi))
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff > 1e-3,
            "a block's own softmax differs from the whole's"
        );
    }
    assert_close("dq sum", &dq_sum, &dq, 1e-12);
}

#[test]
fn strided_fp64_lse_and_backward_from_statistics() {
    for p in problems() {
        let (q, k, v, d_o) = (
            randn(p.q_span(), 5),
            randn(p.k_span(), 6),
            randn(p.v_span(), 7),
            randn(p.o_span(), 8),
        );
        let (o_ref, lse_ref) = forward_f64(&p, &q, &k, &v);
        let bytes = |x: &[f64]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let (qb, kb, vb, dob) = (bytes(&q), bytes(&k), bytes(&v), bytes(&d_o));
        let mut ob = vec![0u8; 8 * p.o_span()];
        let mut lse = vec![0f64; p.lse_len()];
        // SAFETY: every buffer covers its tensor's span (contiguous bhsd, fp64).
        unsafe {
            reference::forward_strided_lse(
                &p,
                qb.as_ptr(),
                kb.as_ptr(),
                vb.as_ptr(),
                ob.as_mut_ptr(),
                LseOut::F64(lse.as_mut_ptr()),
            )
        }
        .unwrap();
        // float64 LSE, not rounded to fp32: bit for bit the oracle's.
        assert_eq!(
            lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            lse_ref.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let o: Vec<f64> = ob
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_close("o", &o, &o_ref, 0.0);
        let (mut dqb, mut dkb, mut dvb) = (
            vec![0u8; 8 * p.q_span()],
            vec![0u8; 8 * p.k_span()],
            vec![0u8; 8 * p.v_span()],
        );
        // SAFETY: as above; outputs distinct from inputs.
        unsafe {
            reference::backward_strided_from_stats(
                &p,
                qb.as_ptr(),
                kb.as_ptr(),
                vb.as_ptr(),
                ob.as_ptr(),
                dob.as_ptr(),
                LseIn::F64(lse.as_ptr()),
                dqb.as_mut_ptr(),
                dkb.as_mut_ptr(),
                dvb.as_mut_ptr(),
            )
        }
        .unwrap();
        let (gq, gk, gv) = backward_f64(&p, &q, &k, &v, &d_o);
        let dec = |x: &[u8]| -> Vec<f64> {
            x.chunks(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_close("dq", &dec(&dqb), &gq, 1e-12);
        assert_close("dk", &dec(&dkb), &gk, 1e-12);
        assert_close("dv", &dec(&dvb), &gv, 1e-12);
    }
}
