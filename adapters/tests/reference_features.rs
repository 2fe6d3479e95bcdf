//! The float64 reference on soft-capping, sinks (off-by-one, learnable with its gradient) and
//! per-sequence lengths (padded either side, packed THD): finite-difference gradient checks and
//! equivalences between problems that must compute the same thing, through the oracle helpers,
//! the host path, the strided-pointer path and `attn-policy run`'s trial.

use attn_policy_adapters::executor::{
    BackwardInputs, DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, ExecError, Executor,
    ForwardInputs, HostTensor, StreamLaunch, run_backward, run_forward,
};
use attn_policy_adapters::reference::{
    self, LseIn, LseOut, Reference, backward_f64_from_stats_sink, backward_f64_sink,
    forward_f64_sink, naive_backward_sink, naive_forward_sink,
};
use attn_policy_adapters::rng::Rng;
use attn_policy_adapters::trial::{RunOptions, VerifyMode, random_inputs, run_random};
use attn_policy_adapters::{
    AttentionProblem, DType, DiagonalAlignment, Direction, LayoutKind, MaskSpec, SeqLens,
    SeqPacking, SoftmaxKind, Strides,
};

fn randn(n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal()).collect()
}

/// Random Q, K, V, dO over the problem's spans (padding rows random too) and sink logits.
struct Data {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    d_o: Vec<f64>,
    sink: Option<Vec<f64>>,
}

fn data(p: &AttentionProblem, seed: u64) -> Data {
    Data {
        q: randn(p.q_span(), seed + 1),
        k: randn(p.k_span(), seed + 2),
        v: randn(p.v_span(), seed + 3),
        d_o: randn(p.o_span(), seed + 4),
        sink: (p.softmax == SoftmaxKind::Learnable).then(|| randn(p.heads_q, seed + 5)),
    }
}

/// Largest |got - want| relative to the largest |want| (1 when want is all zeros).
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-300);
    got.iter()
        .zip(want)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    let e = rel_err(got, want);
    assert!(e <= tol, "{name}: relative error {e:e} > {tol:e}");
}

/// Which tensor of a call.
#[derive(Clone, Copy, Debug)]
enum T {
    Q,
    K,
    V,
    O,
}

/// (strides, heads, head dim, whether its rows are query rows).
fn geo(p: &AttentionProblem, t: T) -> (Strides, usize, usize, bool) {
    match t {
        T::Q => (p.layout.q, p.heads_q, p.head_dim_qk, true),
        T::K => (p.layout.k, p.heads_kv, p.head_dim_qk, false),
        T::V => (p.layout.v, p.heads_kv, p.head_dim_v, false),
        T::O => (p.layout.o, p.heads_q, p.head_dim_v, true),
    }
}

/// (tensor batch, first row, rows) of sequence `b` in tensor `t`.
fn seq(p: &AttentionProblem, t: T, b: usize) -> (usize, usize, usize) {
    let (q, kv) = p.seq_rows(b);
    let r = if geo(p, t).3 { q } else { kv };
    (r.batch, r.start, r.len)
}

/// Sequence `b`'s rows of tensor `t`, `[heads, len, d]`.
fn seq_slice(p: &AttentionProblem, x: &[f64], t: T, b: usize) -> Vec<f64> {
    let (st, heads, d, _) = geo(p, t);
    let (tb, start, len) = seq(p, t, b);
    let mut out = Vec::new();
    for h in 0..heads {
        for i in start..start + len {
            let o = st.offset(tb, h, i, 0);
            out.extend_from_slice(&x[o..o + d]);
        }
    }
    out
}

/// Sequence `b`'s LSE rows, `[h_q, len]`.
fn seq_lse(p: &AttentionProblem, lse: &[f64], b: usize) -> Vec<f64> {
    let (tb, start, len) = seq(p, T::Q, b);
    (0..p.heads_q)
        .flat_map(|h| (start..start + len).map(move |i| lse[p.lse_index(tb, h, i)]))
        .collect()
}

/// Copies sequence `sb` of `sp` into sequence `db` of `dp` (same heads and dims; the
/// lengths must agree).
fn copy_seq(
    sp: &AttentionProblem,
    src: &[f64],
    dp: &AttentionProblem,
    dst: &mut [f64],
    t: T,
    sb: usize,
    db: usize,
) {
    let (sst, heads, d, _) = geo(sp, t);
    let (dst_st, ..) = geo(dp, t);
    let (stb, ss, sl) = seq(sp, t, sb);
    let (dtb, ds, dl) = seq(dp, t, db);
    assert_eq!(sl, dl, "{t:?}: sequence lengths");
    for h in 0..heads {
        for i in 0..sl {
            let so = sst.offset(stb, h, ss + i, 0);
            let o = dst_st.offset(dtb, h, ds + i, 0);
            dst[o..o + d].copy_from_slice(&src[so..so + d]);
        }
    }
}

/// Every element of tensor `t`'s rows that no sequence owns (padding rows).
fn padding_values(p: &AttentionProblem, x: &[f64], t: T) -> Vec<f64> {
    let (st, heads, d, qside) = geo(p, t);
    let rows = if qside { p.rows_q() } else { p.rows_kv() };
    let mut owned = vec![false; p.batch_dim() * rows];
    for b in 0..p.batch {
        let (tb, start, len) = seq(p, t, b);
        for i in start..start + len {
            owned[tb * rows + i] = true;
        }
    }
    let mut out = Vec::new();
    for tb in 0..p.batch_dim() {
        for i in (0..rows).filter(|i| !owned[tb * rows + i]) {
            for h in 0..heads {
                let o = st.offset(tb, h, i, 0);
                out.extend_from_slice(&x[o..o + d]);
            }
        }
    }
    out
}

/// LSE entries of padding rows.
fn padding_lse(p: &AttentionProblem, lse: &[f64]) -> Vec<f64> {
    let mut owned = vec![false; lse.len()];
    for b in 0..p.batch {
        let (tb, start, len) = seq(p, T::Q, b);
        for h in 0..p.heads_q {
            for i in start..start + len {
                owned[p.lse_index(tb, h, i)] = true;
            }
        }
    }
    lse.iter()
        .zip(owned)
        .filter(|(_, o)| !o)
        .map(|(x, _)| *x)
        .collect()
}

/// A problem with every feature: GQA, head_dim_v != head_dim_qk, soft-capping, a learnable
/// sink, per-sequence lengths and the given mask.
fn featured(
    packing: SeqPacking,
    mask: MaskSpec,
    q: Vec<usize>,
    kv: Vec<usize>,
) -> AttentionProblem {
    let (sq, skv) = (*q.iter().max().unwrap(), *kv.iter().max().unwrap());
    let mut p = AttentionProblem::new(q.len(), 4, 2, sq + 1, skv + 2, 8, 6, DType::F64);
    p.mask = mask;
    p.softcap = Some(2.5);
    p.softmax = SoftmaxKind::Learnable;
    let p = p.with_seqlens(SeqLens::padded(packing, q, kv), LayoutKind::Bshd);
    p.validate().unwrap();
    p
}

fn window() -> MaskSpec {
    MaskSpec::window(3, 1, DiagonalAlignment::TopLeft)
}

/// `L = <O, dO>`: its gradients are the backward's for upstream gradient dO.
fn loss(p: &AttentionProblem, d: &Data) -> f64 {
    let (o, _) = forward_f64_sink(p, &d.q, &d.k, &d.v, d.sink.as_deref());
    o.iter().zip(&d.d_o).map(|(a, b)| a * b).sum()
}

/// Central differences of `loss` in every element of Q, K, V and the sink logits, against the
/// analytic gradients (padding included: there both are 0).
fn finite_difference_check(p: &AttentionProblem, seed: u64) {
    let d = data(p, seed);
    let g = backward_f64_sink(p, &d.q, &d.k, &d.v, &d.d_o, d.sink.as_deref());
    let h = 1e-5;
    let fd = |which: usize, n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| {
                let at = |delta: f64| {
                    let mut e = Data {
                        q: d.q.clone(),
                        k: d.k.clone(),
                        v: d.v.clone(),
                        d_o: d.d_o.clone(),
                        sink: d.sink.clone(),
                    };
                    let x = match which {
                        0 => &mut e.q[i],
                        1 => &mut e.k[i],
                        2 => &mut e.v[i],
                        _ => &mut e.sink.as_mut().unwrap()[i],
                    };
                    *x += delta;
                    loss(p, &e)
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect()
    };
    assert_close("dq", &g.dq, &fd(0, d.q.len()), 1e-6);
    assert_close("dk", &g.dk, &fd(1, d.k.len()), 1e-6);
    assert_close("dv", &g.dv, &fd(2, d.v.len()), 1e-6);
    assert_eq!(g.d_sink.len(), p.heads_q);
    assert_close("d_sink", &g.d_sink, &fd(3, p.heads_q), 1e-6);
    // The gradients are not trivially zero, and padding gets exactly zero.
    for (name, x) in [
        ("dq", &g.dq),
        ("dk", &g.dk),
        ("dv", &g.dv),
        ("d_sink", &g.d_sink),
    ] {
        assert!(x.iter().any(|v| v.abs() > 1e-3), "{name} is all zero");
    }
    assert!(padding_values(p, &g.dq, T::Q).iter().all(|x| *x == 0.0));
    assert!(padding_values(p, &g.dk, T::K).iter().all(|x| *x == 0.0));
    assert!(padding_values(p, &g.dv, T::V).iter().all(|x| *x == 0.0));
    // The backward from the forward's statistics gives the same gradients.
    let (o, lse) = forward_f64_sink(p, &d.q, &d.k, &d.v, d.sink.as_deref());
    let s = backward_f64_from_stats_sink(p, &d.q, &d.k, &d.v, &o, &lse, &d.d_o, d.sink.as_deref());
    assert_close("dq from stats", &s.dq, &g.dq, 1e-12);
    assert_close("dk from stats", &s.dk, &g.dk, 1e-12);
    assert_close("dv from stats", &s.dv, &g.dv, 1e-12);
    assert_close("d_sink from stats", &s.d_sink, &g.d_sink, 1e-12);
    // The naive baseline in float64 rounds nothing: it is the oracle.
    let n = naive_backward_sink(p, &d.q, &d.k, &d.v, &d.d_o, d.sink.as_deref());
    assert_close("naive dq", &n.dq, &g.dq, 1e-12);
    assert_close("naive d_sink", &n.d_sink, &g.d_sink, 1e-12);
}

#[test]
fn finite_differences_softcap_learnable_sink_padded_gqa_window() {
    let p = featured(
        SeqPacking::PaddedRight,
        window(),
        vec![5, 2, 4],
        vec![6, 3, 1],
    );
    finite_difference_check(&p, 10);
}

#[test]
fn finite_differences_packed_and_left_padded_causal_bottom_right() {
    for packing in [SeqPacking::Packed, SeqPacking::PaddedLeft] {
        let p = featured(
            packing,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            vec![3, 5],
            vec![6, 4],
        );
        finite_difference_check(&p, 20);
    }
}

/// Every sequence of a padded batch run alone as its own problem: same outputs and gradients
/// in its rows, the batch's d_sink the sum of the sequences', and padding O = 0, LSE = -inf,
/// zero gradients. A sequence without keys is empty even with its sink.
#[test]
fn a_padded_batch_equals_each_sequence_alone() {
    let masks = [
        MaskSpec::NONE,
        MaskSpec::CAUSAL_TOP_LEFT,
        MaskSpec::CAUSAL_BOTTOM_RIGHT,
        window(),
        MaskSpec::window(2, 0, DiagonalAlignment::BottomRight),
    ];
    for packing in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ] {
        for (n, mask) in masks.into_iter().enumerate() {
            let (ql, kvl) = (vec![4, 1, 6, 3, 2], vec![7, 5, 2, 3, 0]);
            let p = featured(packing, mask, ql.clone(), kvl.clone());
            let d = data(&p, 100 + n as u64);
            let sink = d.sink.as_deref();
            let (o, lse) = forward_f64_sink(&p, &d.q, &d.k, &d.v, sink);
            let g = backward_f64_sink(&p, &d.q, &d.k, &d.v, &d.d_o, sink);
            let mut d_sink = vec![0.0; p.heads_q];
            for b in 0..p.batch {
                if kvl[b] == 0 {
                    assert!(seq_slice(&p, &o, T::O, b).iter().all(|x| *x == 0.0));
                    assert!(seq_lse(&p, &lse, b).iter().all(|x| *x == f64::NEG_INFINITY));
                    assert!(seq_slice(&p, &g.dq, T::Q, b).iter().all(|x| *x == 0.0));
                    continue;
                }
                let mut a = AttentionProblem::new(1, 4, 2, ql[b], kvl[b], 8, 6, DType::F64);
                a.mask = mask;
                a.softcap = p.softcap;
                a.softmax = p.softmax;
                let mut ad = data(&a, 0);
                copy_seq(&p, &d.q, &a, &mut ad.q, T::Q, b, 0);
                copy_seq(&p, &d.k, &a, &mut ad.k, T::K, b, 0);
                copy_seq(&p, &d.v, &a, &mut ad.v, T::V, b, 0);
                copy_seq(&p, &d.d_o, &a, &mut ad.d_o, T::O, b, 0);
                let (ao, alse) = forward_f64_sink(&a, &ad.q, &ad.k, &ad.v, sink);
                let ag = backward_f64_sink(&a, &ad.q, &ad.k, &ad.v, &ad.d_o, sink);
                let what = format!("{packing:?} mask {n} sequence {b}");
                assert_close(
                    &format!("o {what}"),
                    &seq_slice(&p, &o, T::O, b),
                    &seq_slice(&a, &ao, T::O, 0),
                    1e-13,
                );
                let (l, al) = (seq_lse(&p, &lse, b), seq_lse(&a, &alse, 0));
                assert_eq!(
                    l.iter().map(|x| x.is_finite()).collect::<Vec<_>>(),
                    al.iter().map(|x| x.is_finite()).collect::<Vec<_>>(),
                    "lse rows {what}"
                );
                let fin = |x: &[f64]| {
                    x.iter()
                        .map(|v| if v.is_finite() { *v } else { 0.0 })
                        .collect::<Vec<_>>()
                };
                assert_close(&format!("lse {what}"), &fin(&l), &fin(&al), 1e-13);
                assert_close(
                    &format!("dq {what}"),
                    &seq_slice(&p, &g.dq, T::Q, b),
                    &seq_slice(&a, &ag.dq, T::Q, 0),
                    1e-12,
                );
                assert_close(
                    &format!("dk {what}"),
                    &seq_slice(&p, &g.dk, T::K, b),
                    &seq_slice(&a, &ag.dk, T::K, 0),
                    1e-12,
                );
                assert_close(
                    &format!("dv {what}"),
                    &seq_slice(&p, &g.dv, T::V, b),
                    &seq_slice(&a, &ag.dv, T::V, 0),
                    1e-12,
                );
                for (s, x) in d_sink.iter_mut().zip(&ag.d_sink) {
                    *s += x;
                }
            }
            assert_close("d_sink = sum over sequences", &g.d_sink, &d_sink, 1e-12);
            assert!(padding_values(&p, &o, T::O).iter().all(|x| *x == 0.0));
            assert!(
                padding_lse(&p, &lse)
                    .iter()
                    .all(|x| *x == f64::NEG_INFINITY)
            );
            assert!(padding_values(&p, &g.dq, T::Q).iter().all(|x| *x == 0.0));
            assert!(padding_values(&p, &g.dk, T::K).iter().all(|x| *x == 0.0));
            assert!(padding_values(&p, &g.dv, T::V).iter().all(|x| *x == 0.0));
            if packing != SeqPacking::Packed {
                assert!(!padding_lse(&p, &lse).is_empty(), "the batch has padding");
            }
        }
    }
}

/// The same sequences padded left, padded right and packed: the same values in every
/// sequence's rows.
#[test]
fn padded_left_right_and_packed_agree() {
    let (ql, kvl) = (vec![3, 6, 1], vec![5, 6, 4]);
    let mk = |packing| {
        featured(
            packing,
            MaskSpec::CAUSAL_BOTTOM_RIGHT,
            ql.clone(),
            kvl.clone(),
        )
    };
    let right = mk(SeqPacking::PaddedRight);
    let d = data(&right, 7);
    let sink = d.sink.as_deref();
    let (o, lse) = forward_f64_sink(&right, &d.q, &d.k, &d.v, sink);
    let g = backward_f64_sink(&right, &d.q, &d.k, &d.v, &d.d_o, sink);
    for packing in [SeqPacking::PaddedLeft, SeqPacking::Packed] {
        let p = mk(packing);
        let mut e = data(&p, 8);
        for b in 0..p.batch {
            copy_seq(&right, &d.q, &p, &mut e.q, T::Q, b, b);
            copy_seq(&right, &d.k, &p, &mut e.k, T::K, b, b);
            copy_seq(&right, &d.v, &p, &mut e.v, T::V, b, b);
            copy_seq(&right, &d.d_o, &p, &mut e.d_o, T::O, b, b);
        }
        let (o2, lse2) = forward_f64_sink(&p, &e.q, &e.k, &e.v, sink);
        let g2 = backward_f64_sink(&p, &e.q, &e.k, &e.v, &e.d_o, sink);
        for b in 0..p.batch {
            let w = format!("{packing:?} sequence {b}");
            assert_eq!(
                seq_slice(&p, &o2, T::O, b),
                seq_slice(&right, &o, T::O, b),
                "o {w}"
            );
            assert_eq!(seq_lse(&p, &lse2, b), seq_lse(&right, &lse, b), "lse {w}");
            assert_eq!(
                seq_slice(&p, &g2.dq, T::Q, b),
                seq_slice(&right, &g.dq, T::Q, b),
                "dq {w}"
            );
            assert_eq!(
                seq_slice(&p, &g2.dk, T::K, b),
                seq_slice(&right, &g.dk, T::K, b),
                "dk {w}"
            );
            assert_eq!(
                seq_slice(&p, &g2.dv, T::V, b),
                seq_slice(&right, &g.dv, T::V, b),
                "dv {w}"
            );
        }
        assert_close(&format!("d_sink {packing:?}"), &g2.d_sink, &g.d_sink, 1e-13);
        assert!(padding_values(&p, &o2, T::O).iter().all(|x| *x == 0.0));
        assert!(padding_values(&p, &g2.dk, T::K).iter().all(|x| *x == 0.0));
    }
}

#[test]
fn off_by_one_is_a_learnable_sink_of_zero_logits() {
    let mut l = featured(SeqPacking::PaddedRight, window(), vec![4, 2], vec![5, 5]);
    let d = data(&l, 30);
    let zeros = vec![0.0; l.heads_q];
    let (o1, lse1) = forward_f64_sink(&l, &d.q, &d.k, &d.v, Some(&zeros));
    let g1 = backward_f64_sink(&l, &d.q, &d.k, &d.v, &d.d_o, Some(&zeros));
    l.softmax = SoftmaxKind::OffByOne;
    let (o2, lse2) = forward_f64_sink(&l, &d.q, &d.k, &d.v, None);
    let g2 = backward_f64_sink(&l, &d.q, &d.k, &d.v, &d.d_o, None);
    assert_eq!(o1, o2);
    assert_eq!(lse1, lse2);
    assert_eq!((&g1.dq, &g1.dk, &g1.dv), (&g2.dq, &g2.dk, &g2.dv));
    assert!(g2.d_sink.is_empty(), "off-by-one has no sink gradient");
    // And the sink matters: the vanilla softmax differs.
    l.softmax = SoftmaxKind::Vanilla;
    let (o3, _) = forward_f64_sink(&l, &d.q, &d.k, &d.v, None);
    assert!(rel_err(&o3, &o1) > 1e-3);
}

#[test]
fn a_huge_softcap_is_no_softcap() {
    let mut p = featured(
        SeqPacking::PaddedLeft,
        MaskSpec::CAUSAL_TOP_LEFT,
        vec![4, 6],
        vec![6, 3],
    );
    let d = data(&p, 40);
    let sink = d.sink.as_deref();
    let capped = |p: &AttentionProblem| {
        let (o, lse) = forward_f64_sink(p, &d.q, &d.k, &d.v, sink);
        (o, lse, backward_f64_sink(p, &d.q, &d.k, &d.v, &d.d_o, sink))
    };
    p.softcap = Some(1e9);
    let (o1, lse1, g1) = capped(&p);
    p.softcap = None;
    let (o2, lse2, g2) = capped(&p);
    assert_close("o", &o1, &o2, 1e-12);
    let fin = |x: &[f64]| {
        x.iter()
            .map(|v| if v.is_finite() { *v } else { 0.0 })
            .collect::<Vec<_>>()
    };
    assert_close("lse", &fin(&lse1), &fin(&lse2), 1e-12);
    assert_close("dq", &g1.dq, &g2.dq, 1e-12);
    assert_close("dk", &g1.dk, &g2.dk, 1e-12);
    assert_close("dv", &g1.dv, &g2.dv, 1e-12);
    assert_close("d_sink", &g1.d_sink, &g2.d_sink, 1e-12);
    // A small cap does change the result.
    p.softcap = Some(0.5);
    assert!(rel_err(&capped(&p).0, &o2) > 1e-3);
}

/// Batched decode: one query per sequence, left-padded keys of different lengths, bottom-right
/// causal: each query sees exactly its own sequence's keys.
#[test]
fn decode_bottom_right_causal_per_sequence() {
    let kvl = vec![3, 7, 5, 1];
    let mut p = AttentionProblem::new(4, 4, 2, 1, 7, 8, 8, DType::F64);
    p.mask = MaskSpec::CAUSAL_BOTTOM_RIGHT;
    p.softmax = SoftmaxKind::Learnable;
    let p = p.with_seqlens(
        SeqLens::padded(SeqPacking::PaddedLeft, vec![1; 4], kvl.clone()),
        LayoutKind::Bshd,
    );
    let d = data(&p, 50);
    let sink = d.sink.as_deref();
    let (o, lse) = forward_f64_sink(&p, &d.q, &d.k, &d.v, sink);
    let g = backward_f64_sink(&p, &d.q, &d.k, &d.v, &d.d_o, sink);
    for (b, &n) in kvl.iter().enumerate() {
        let mut a = AttentionProblem::new(1, 4, 2, 1, n, 8, 8, DType::F64);
        a.softmax = SoftmaxKind::Learnable;
        let mut ad = data(&a, 0);
        copy_seq(&p, &d.q, &a, &mut ad.q, T::Q, b, 0);
        copy_seq(&p, &d.k, &a, &mut ad.k, T::K, b, 0);
        copy_seq(&p, &d.v, &a, &mut ad.v, T::V, b, 0);
        copy_seq(&p, &d.d_o, &a, &mut ad.d_o, T::O, b, 0);
        // Unmasked: bottom-right causal with one query admits every key.
        let (ao, alse) = forward_f64_sink(&a, &ad.q, &ad.k, &ad.v, sink);
        let ag = backward_f64_sink(&a, &ad.q, &ad.k, &ad.v, &ad.d_o, sink);
        assert_close(
            "o",
            &seq_slice(&p, &o, T::O, b),
            &seq_slice(&a, &ao, T::O, 0),
            1e-13,
        );
        assert_close("lse", &seq_lse(&p, &lse, b), &seq_lse(&a, &alse, 0), 1e-13);
        assert_close(
            "dk",
            &seq_slice(&p, &g.dk, T::K, b),
            &seq_slice(&a, &ag.dk, T::K, 0),
            1e-12,
        );
    }
    // Left padding keys get no gradient.
    assert!(padding_values(&p, &g.dk, T::K).iter().all(|x| *x == 0.0));
}

/// A fully masked row with a sink is empty: O = 0, LSE = -inf, and no share of d_sink.
#[test]
fn a_fully_masked_row_is_empty_even_with_a_sink() {
    // s_q > s_kv, bottom-right: the first s_q - s_kv rows see no key.
    let mut p = AttentionProblem::new(1, 2, 2, 6, 3, 4, 4, DType::F64);
    p.mask = MaskSpec::CAUSAL_BOTTOM_RIGHT;
    p.softmax = SoftmaxKind::Learnable;
    let d = data(&p, 60);
    let sink = d.sink.as_deref();
    let (o, lse) = forward_f64_sink(&p, &d.q, &d.k, &d.v, sink);
    let g = backward_f64_sink(&p, &d.q, &d.k, &d.v, &d.d_o, sink);
    for h in 0..2 {
        for i in 0..3 {
            assert_eq!(lse[p.lse_index(0, h, i)], f64::NEG_INFINITY);
            let at = p.layout.o.offset(0, h, i, 0);
            assert!(o[at..at + 4].iter().all(|x| *x == 0.0));
            let at = p.layout.q.offset(0, h, i, 0);
            assert!(g.dq[at..at + 4].iter().all(|x| *x == 0.0));
        }
    }
    // d_sink over the admitted rows only: the same as the problem of those rows alone.
    let mut a = AttentionProblem::new(1, 2, 2, 3, 3, 4, 4, DType::F64);
    a.mask = MaskSpec::CAUSAL_BOTTOM_RIGHT;
    a.softmax = SoftmaxKind::Learnable;
    let rows = |x: &[f64]| -> Vec<f64> {
        // bshd [1, 6, 2, 4]: rows 3..6.
        x[3 * 8..6 * 8].to_vec()
    };
    let ag = backward_f64_sink(&a, &rows(&d.q), &d.k, &d.v, &rows(&d.d_o), sink);
    assert_close("d_sink", &g.d_sink, &ag.d_sink, 1e-13);
}

fn host(p: &AttentionProblem, x: &[f64]) -> HostTensor {
    HostTensor {
        dtype: p.dtype,
        data: x.iter().map(|v| p.dtype.to_bits(*v)).collect(),
    }
}

#[test]
fn a_learnable_sink_without_logits_is_invalid_input() {
    let mut p = featured(SeqPacking::PaddedRight, window(), vec![3, 2], vec![4, 4]);
    p.dtype = DType::F16;
    let d = data(&p, 70);
    let (q, k, v) = (host(&p, &d.q), host(&p, &d.k), host(&p, &d.v));
    let bad_len = vec![0.0f32; p.heads_q - 1];
    for sink in [None, Some(bad_len.as_slice())] {
        let e = run_forward(
            &Reference,
            &p,
            &ForwardInputs {
                q: &q,
                k: &k,
                v: &v,
                sink,
            },
        );
        assert!(matches!(e, Err(ExecError::InvalidInput { .. })), "{e:?}");
    }
    // Logits for a softmax that takes none would be ignored: refused too.
    let mut vanilla = p.clone();
    vanilla.softmax = SoftmaxKind::Vanilla;
    let logits = vec![0.0f32; p.heads_q];
    let e = run_forward(
        &Reference,
        &vanilla,
        &ForwardInputs {
            q: &q,
            k: &k,
            v: &v,
            sink: Some(&logits),
        },
    );
    assert!(matches!(e, Err(ExecError::InvalidInput { .. })), "{e:?}");
    // The pointer paths: a null sink pointer for a learnable problem.
    let mut p64 = p.clone();
    p64.dtype = DType::F64;
    let plan = Reference.plan(&p64, Direction::Forward).unwrap();
    let (mut o, mut lse) = (vec![0.0f64; p64.o_span()], vec![0.0f64; p64.lse_len()]);
    let io = DeviceIo::Forward(DeviceForwardArgs {
        q: d.q.as_ptr() as u64,
        k: d.k.as_ptr() as u64,
        v: d.v.as_ptr() as u64,
        o: o.as_mut_ptr() as u64,
        lse: lse.as_mut_ptr() as u64,
        sink: 0,
    });
    let launch = StreamLaunch {
        device: 0,
        stream: 0,
        workspace: 0,
        workspace_bytes: 0,
    };
    // SAFETY: host buffers covering the problem's spans (fp64), outputs distinct from inputs.
    let e = unsafe { plan.enqueue(&io, &launch) };
    assert!(matches!(e, Err(ExecError::InvalidInput { .. })), "{e:?}");
    // The oracle helpers panic rather than compute a vanilla softmax.
    let r = std::panic::catch_unwind(|| reference::forward_f64(&p64, &d.q, &d.k, &d.v));
    assert!(r.is_err());
}

#[test]
fn the_manifest_admits_every_feature() {
    for packing in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ] {
        for softmax in [
            SoftmaxKind::Vanilla,
            SoftmaxKind::OffByOne,
            SoftmaxKind::Learnable,
        ] {
            let mut p = featured(
                packing,
                MaskSpec::CAUSAL_BOTTOM_RIGHT,
                vec![2, 3],
                vec![3, 1],
            );
            p.softmax = softmax;
            for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
                p.dtype = dtype;
                assert_eq!(Reference.check(&p), Ok(()));
                assert_eq!(reference::manifest().admits(&p), Ok(()));
            }
        }
    }
}

/// The host path (fp16 tensors): the oracle's values rounded, d_sink included.
#[test]
fn host_path_serves_the_features() {
    let mut p = featured(SeqPacking::Packed, window(), vec![3, 5, 2], vec![4, 2, 6]);
    p.dtype = DType::BF16;
    let d = data(&p, 80);
    let (q, k, v, d_o) = (
        host(&p, &d.q),
        host(&p, &d.k),
        host(&p, &d.v),
        host(&p, &d.d_o),
    );
    let logits: Vec<f32> = d.sink.as_ref().unwrap().iter().map(|x| *x as f32).collect();
    let dec = |t: &HostTensor| reference::decode(t);
    let (qd, kd, vd, dod) = (dec(&q), dec(&k), dec(&v), dec(&d_o));
    let s64: Vec<f64> = logits.iter().map(|x| *x as f64).collect();
    let f = run_forward(
        &Reference,
        &p,
        &ForwardInputs {
            q: &q,
            k: &k,
            v: &v,
            sink: Some(&logits),
        },
    )
    .unwrap();
    let (o, lse) = forward_f64_sink(&p, &qd, &kd, &vd, Some(&s64));
    assert_eq!(f.o, host(&p, &o));
    assert_eq!(f.lse, lse.iter().map(|x| *x as f32).collect::<Vec<_>>());
    let b = run_backward(
        &Reference,
        &p,
        &BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            o: &f.o,
            d_o: &d_o,
            lse: &f.lse,
            sink: Some(&logits),
        },
    )
    .unwrap();
    let g = backward_f64_sink(&p, &qd, &kd, &vd, &dod, Some(&s64));
    assert_eq!(b.dq, host(&p, &g.dq));
    assert_eq!(b.dk, host(&p, &g.dk));
    assert_eq!(
        b.d_sink,
        g.d_sink.iter().map(|x| *x as f32).collect::<Vec<_>>()
    );
}

/// The strided-pointer path (the Python binding's CPU path, fp32): every output element is
/// written (the buffers start as NaN), padding included, and matches the oracle.
#[test]
fn pointer_path_writes_every_element() {
    let mut p = featured(
        SeqPacking::PaddedLeft,
        MaskSpec::CAUSAL_BOTTOM_RIGHT,
        vec![4, 1, 3],
        vec![2, 6, 5],
    );
    p.dtype = DType::F32;
    let d = data(&p, 90);
    let f32s = |x: &[f64]| x.iter().map(|v| *v as f32).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (f32s(&d.q), f32s(&d.k), f32s(&d.v), f32s(&d.d_o));
    let sink = f32s(d.sink.as_ref().unwrap());
    let back = |x: &[f32]| x.iter().map(|v| *v as f64).collect::<Vec<f64>>();
    let (qd, kd, vd, dod, sd) = (back(&q), back(&k), back(&v), back(&d_o), back(&sink));
    let (mut o, mut lse) = (vec![f32::NAN; p.o_span()], vec![f32::NAN; p.lse_len()]);
    let launch = StreamLaunch {
        device: 0,
        stream: 0,
        workspace: 0,
        workspace_bytes: 0,
    };
    let fwd = Reference.plan(&p, Direction::Forward).unwrap();
    let io = DeviceIo::Forward(DeviceForwardArgs {
        q: q.as_ptr() as u64,
        k: k.as_ptr() as u64,
        v: v.as_ptr() as u64,
        o: o.as_mut_ptr() as u64,
        lse: lse.as_mut_ptr() as u64,
        sink: sink.as_ptr() as u64,
    });
    // SAFETY: host buffers covering the spans (fp32), outputs distinct from inputs.
    unsafe { fwd.enqueue(&io, &launch) }.unwrap();
    let (o_ref, lse_ref) = forward_f64_sink(&p, &qd, &kd, &vd, Some(&sd));
    assert_eq!(o, f32s(&o_ref));
    assert_eq!(lse, f32s(&lse_ref));
    let (mut dq, mut dk, mut dv, mut d_sink) = (
        vec![f32::NAN; p.q_span()],
        vec![f32::NAN; p.k_span()],
        vec![f32::NAN; p.v_span()],
        vec![f32::NAN; p.heads_q],
    );
    let bwd = Reference.plan(&p, Direction::Backward).unwrap();
    let io = DeviceIo::Backward(DeviceBackwardArgs {
        q: q.as_ptr() as u64,
        k: k.as_ptr() as u64,
        v: v.as_ptr() as u64,
        o: o.as_ptr() as u64,
        d_o: d_o.as_ptr() as u64,
        lse: lse.as_ptr() as u64,
        dq: dq.as_mut_ptr() as u64,
        dk: dk.as_mut_ptr() as u64,
        dv: dv.as_mut_ptr() as u64,
        sink: sink.as_ptr() as u64,
        d_sink: d_sink.as_mut_ptr() as u64,
    });
    // SAFETY: as above.
    unsafe { bwd.enqueue(&io, &launch) }.unwrap();
    let g = backward_f64_sink(&p, &qd, &kd, &vd, &dod, Some(&sd));
    for (name, got, want) in [
        ("dq", &dq, &g.dq),
        ("dk", &dk, &g.dk),
        ("dv", &dv, &g.dv),
        ("d_sink", &d_sink, &g.d_sink),
    ] {
        assert!(
            got.iter().all(|x| !x.is_nan()),
            "{name}: every element written"
        );
        // From the fp32-rounded O and LSE: fp32 accuracy.
        assert_close(name, &back(got), want, 1e-5);
    }
    // The learnable backward without its d_sink output is refused.
    let io = DeviceIo::Backward(DeviceBackwardArgs {
        q: q.as_ptr() as u64,
        k: k.as_ptr() as u64,
        v: v.as_ptr() as u64,
        o: o.as_ptr() as u64,
        d_o: d_o.as_ptr() as u64,
        lse: lse.as_ptr() as u64,
        dq: dq.as_mut_ptr() as u64,
        dk: dk.as_mut_ptr() as u64,
        dv: dv.as_mut_ptr() as u64,
        sink: sink.as_ptr() as u64,
        d_sink: 0,
    });
    // SAFETY: as above.
    let e = unsafe { bwd.enqueue(&io, &launch) };
    assert!(matches!(e, Err(ExecError::InvalidInput { .. })), "{e:?}");
    // The fp64 strided entry points agree with the oracle bit for bit.
    let mut p64 = p.clone();
    p64.dtype = DType::F64;
    let (mut o64, mut lse64) = (vec![f64::NAN; p64.o_span()], vec![f64::NAN; p64.lse_len()]);
    // SAFETY: host buffers covering the spans (fp64).
    unsafe {
        reference::forward_strided_sink(
            &p64,
            d.q.as_ptr().cast(),
            d.k.as_ptr().cast(),
            d.v.as_ptr().cast(),
            o64.as_mut_ptr().cast(),
            LseOut::F64(lse64.as_mut_ptr()),
            sink.as_ptr(),
        )
    }
    .unwrap();
    let (o_ref, lse_ref) = forward_f64_sink(&p64, &d.q, &d.k, &d.v, Some(&sd));
    assert_eq!(o64, o_ref);
    assert_eq!(
        lse64.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        lse_ref.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let (mut gq, mut gk, mut gv, mut gs) = (
        vec![f64::NAN; p64.q_span()],
        vec![f64::NAN; p64.k_span()],
        vec![f64::NAN; p64.v_span()],
        vec![f32::NAN; p64.heads_q],
    );
    // SAFETY: as above.
    unsafe {
        reference::backward_strided_from_stats_sink(
            &p64,
            d.q.as_ptr().cast(),
            d.k.as_ptr().cast(),
            d.v.as_ptr().cast(),
            o64.as_ptr().cast(),
            d.d_o.as_ptr().cast(),
            LseIn::F64(lse64.as_ptr()),
            gq.as_mut_ptr().cast(),
            gk.as_mut_ptr().cast(),
            gv.as_mut_ptr().cast(),
            sink.as_ptr(),
            gs.as_mut_ptr(),
        )
    }
    .unwrap();
    let g = backward_f64_sink(&p64, &d.q, &d.k, &d.v, &d.d_o, Some(&sd));
    assert_close("dq f64", &gq, &g.dq, 1e-12);
    assert_close("dk f64", &gk, &g.dk, 1e-12);
    assert_close("dv f64", &gv, &g.dv, 1e-12);
    assert_close("d_sink f64", &back(&gs), &g.d_sink, 1e-6);
}

/// `attn-policy run`'s trial on the reference: random learnable logits, the d_sink check
/// present and passing; the naive baseline rounds (its error is not zero).
#[test]
fn the_trial_draws_sink_logits_and_checks_d_sink() {
    let mut p = featured(
        SeqPacking::PaddedRight,
        window(),
        vec![5, 2, 7],
        vec![6, 8, 3],
    );
    p.dtype = DType::BF16;
    let inputs = random_inputs(&p, 5);
    assert_eq!(inputs.sink.as_ref().map(Vec::len), Some(p.heads_q));
    let opts = RunOptions {
        verify: VerifyMode::Always,
        ..RunOptions::default()
    };
    for packing in [
        SeqPacking::PaddedRight,
        SeqPacking::PaddedLeft,
        SeqPacking::Packed,
    ] {
        for softmax in [SoftmaxKind::OffByOne, SoftmaxKind::Learnable] {
            let mut p = featured(packing, window(), vec![5, 2, 7], vec![6, 8, 3]);
            p.dtype = DType::BF16;
            p.softmax = softmax;
            let r = run_random("reference", &p, 5, &opts).unwrap();
            let v = r.verification.unwrap();
            assert!(v.passed, "{packing:?} {softmax:?}: {v:?}");
            let names: Vec<&str> = v.checks.iter().map(|c| c.name.as_str()).collect();
            let mut want = vec!["o", "dq", "dk", "dv"];
            if softmax == SoftmaxKind::Learnable {
                want.push("d_sink");
            }
            assert_eq!(names, want);
            assert!(v.checks.iter().all(|c| c.naive_err > 0.0), "{v:?}");
        }
    }
    // The naive same-dtype variants serve the features: close to the oracle, not equal.
    let d = data(&p, 3);
    let sink = d.sink.as_deref();
    let (o, _) = forward_f64_sink(&p, &d.q, &d.k, &d.v, sink);
    let (on, _) = naive_forward_sink(&p, &d.q, &d.k, &d.v, sink);
    let e = rel_err(&on, &o);
    assert!(e > 0.0 && e < 0.05, "naive bf16 error {e}");
}

/// The naive baseline with grouped heads is attention on K and V expanded to every query head:
/// each query head's dK and dV are rounded to the dtype, then the group's sum is (what the
/// expansion's backward does). Checked bit for bit against the same heads run one at a time
/// as MHA problems, summed and rounded here.
#[test]
fn naive_grouped_gradients_are_rounded_per_head_then_summed() {
    let (hq, s, d) = (4usize, 24usize, 16usize);
    for dtype in [DType::BF16, DType::F16] {
        let p =
            AttentionProblem::new(1, hq, 1, s, s, d, d, dtype).with_mask(MaskSpec::CAUSAL_TOP_LEFT);
        let dat = data(&p, 77);
        let g = naive_backward_sink(&p, &dat.q, &dat.k, &dat.v, &dat.d_o, None);
        let one =
            AttentionProblem::new(1, 1, 1, s, s, d, d, dtype).with_mask(MaskSpec::CAUSAL_TOP_LEFT);
        // bshd: row i of head h starts at (i * hq + h) * d
        let head = |x: &[f64], h: usize| -> Vec<f64> {
            (0..s)
                .flat_map(|i| x[(i * hq + h) * d..(i * hq + h + 1) * d].to_vec())
                .collect()
        };
        let (mut dk, mut dv) = (vec![0.0; s * d], vec![0.0; s * d]);
        for h in 0..hq {
            let gh = naive_backward_sink(
                &one,
                &head(&dat.q, h),
                &dat.k,
                &dat.v,
                &head(&dat.d_o, h),
                None,
            );
            for (a, b) in dk.iter_mut().zip(&gh.dk) {
                *a += b;
            }
            for (a, b) in dv.iter_mut().zip(&gh.dv) {
                *a += b;
            }
        }
        let round = |x: Vec<f64>| -> Vec<f64> { x.into_iter().map(|v| dtype.round(v)).collect() };
        assert_eq!(g.dk, round(dk), "{dtype:?} dK");
        assert_eq!(g.dv, round(dv), "{dtype:?} dV");
        // and the exact gradients differ from the rounded ones (the test can fail)
        let exact = backward_f64_sink(&p, &dat.q, &dat.k, &dat.v, &dat.d_o, None);
        assert_ne!(g.dv, exact.dv);
    }
}
