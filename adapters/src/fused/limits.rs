//! The fused executor's registry name, tile sizes, head-dim and shared-memory limits, manifest
//! and exact gate ([`check_problem`]): what `mod.rs`, the CUDA build (`enabled.rs`) and its
//! stand-in (`disabled.rs`) share. It names none of them (no circle of files).

use crate::executor::{DeviceKind, Features, HeadDimRange, Manifest, Unsupported};
use crate::problem::{AttentionProblem, DType, LayoutKind, MaskKind, SeqPacking, SoftmaxKind};

/// Registry name.
pub const NAME: &str = "fused";

/// Smallest and largest head dim (Q/K and V) the kernel is built and tested for.
pub const MIN_HEAD_DIM: usize = 264;
/// See [`MIN_HEAD_DIM`].
pub const MAX_HEAD_DIM: usize = 512;

/// Query rows per CTA (and the grid's y extent limit divides the longest query sequence).
pub const BLOCK_M: usize = 64;
/// Keys per iteration.
pub const BLOCK_N: usize = 64;

/// The only compute capability the wgmma code runs on (`sm_90a` features do not carry over to
/// sm_100 or later).
pub const COMPUTE_CAPABILITY: (u32, u32) = (9, 0);

/// Padded head dims a kernel variant is compiled for: qk to a multiple of 64 (the 64-column
/// swizzle atom of the K tiles), v to a multiple of 64 (two output warpgroups, each a wgmma N
/// that is a multiple of 32).
pub fn padded_dims(head_dim_qk: usize, head_dim_v: usize) -> (usize, usize) {
    (head_dim_qk.div_ceil(64) * 64, head_dim_v.div_ceil(64) * 64)
}

/// Dynamic shared memory of a variant (`SMEM_USED` in `kernels.cu`): two K tiles, one V^T tile,
/// two probability tiles, Q's columns past 384 (the first 384 live in registers), two rescale
/// vectors and the 1/l vector (fp32 per row), twelve mbarriers, and 1 KiB for aligning the base
/// to the swizzle atom.
pub fn shared_bytes(dqk_pad: usize, dv_pad: usize) -> usize {
    2 * BLOCK_N * dqk_pad * 2
        + dv_pad * BLOCK_N * 2
        + 2 * BLOCK_M * BLOCK_N * 2
        + BLOCK_M * dqk_pad.saturating_sub(384) * 2
        + 2 * BLOCK_M * 4
        + BLOCK_M * 4
        + 12 * 8
        + 1024
}

/// Dynamic shared memory of the backward's score kernel (`BSMEM_USED` in `backward.cu`): five
/// ring slots of a 128 x 64 A tile and a 128 x 64 B tile, the staging of P and dS (2 x 128 x 128
/// elements), ten mbarriers, and 1 KiB for aligning the base.
pub fn backward_shared_bytes() -> usize {
    5 * (128 * 64 * 2 + 128 * 64 * 2) + 2 * 128 * 128 * 2 + 10 * 8 + 1024
}

/// Ints per sequence of the per-sequence table (`SEQ_INTS` in `kernels.cu`): tensor batch, q
/// start, q len, kv start, kv len, diagonal offset, first column of the sequence's keys in the
/// transposed V ([`seq_v_columns`]), one spare.
pub const SEQ_TABLE_INTS: usize = 8;

/// The per-sequence table the kernels read from device memory (empty without `seqlens`):
/// [`SEQ_TABLE_INTS`] ints per sequence, from [`AttentionProblem::seq_rows`] and
/// [`AttentionProblem::seq_mask`] (the window bounds are the same for every sequence and
/// travel as kernel parameters). [`check_problem`] keeps every value within `i32`.
pub fn seq_table(p: &AttentionProblem) -> Vec<i32> {
    if p.seqlens.is_none() {
        return Vec::new();
    }
    let mut t = Vec::with_capacity(p.batch * SEQ_TABLE_INTS);
    let mut col = 0usize;
    for b in 0..p.batch {
        let (q, kv) = p.seq_rows(b);
        let m = p.seq_mask(b);
        let v = [q.batch, q.start, q.len, kv.start, kv.len];
        t.extend(v.iter().map(|&x| x as i32));
        t.extend([m.offset as i32, col as i32, 0]);
        col += kv.len.div_ceil(BLOCK_N) * BLOCK_N;
    }
    t
}

/// Columns of the transposed V with per-sequence lengths: each sequence's keys start at a
/// multiple of 64 (a TMA box starts 16-byte aligned in its innermost dimension; a sequence's
/// first key in the tensors need not be), at least one tile.
pub fn seq_v_columns(p: &AttentionProblem) -> usize {
    let cols: usize = p.seqlens.as_ref().map_or(0, |s| {
        s.kv.iter().map(|l| l.div_ceil(BLOCK_N) * BLOCK_N).sum()
    });
    cols.max(BLOCK_N)
}

/// Bytes of the per-sequence table in a workspace (256-byte aligned; 0 without `seqlens`).
pub fn seq_table_bytes(p: &AttentionProblem) -> u64 {
    let n = if p.seqlens.is_some() { p.batch } else { 0 };
    ((n * SEQ_TABLE_INTS * 4) as u64).div_ceil(256) * 256
}

/// Bytes of the forward's transposed V: `[b, h_kv, d_v, round_up(s_kv, 64)]`, or with
/// per-sequence lengths `[h_kv, d_v, seq_v_columns]`.
pub fn transposed_v_bytes(p: &AttentionProblem) -> u64 {
    let bytes = if p.seqlens.is_some() {
        (p.heads_kv * p.head_dim_v) as u64 * seq_v_columns(p) as u64 * 2
    } else {
        let skv_pad = p.seqlen_kv.div_ceil(BLOCK_N) * BLOCK_N;
        (p.batch * p.heads_kv * p.head_dim_v) as u64 * skv_pad as u64 * 2
    };
    bytes.div_ceil(256) * 256
}

/// Bytes of the forward's workspace: the transposed V, then the per-sequence table.
pub fn forward_workspace_bytes(p: &AttentionProblem) -> u64 {
    transposed_v_bytes(p) + seq_table_bytes(p)
}

/// The fused executor's manifest.
pub fn manifest() -> Manifest {
    Manifest {
        name: NAME.into(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(90),
        max_compute_capability: Some(90),
        dtypes: vec![DType::F16, DType::BF16],
        head_dim_qk: HeadDimRange {
            min: MIN_HEAD_DIM,
            max: MAX_HEAD_DIM,
            multiple_of: 8,
        },
        head_dim_v: HeadDimRange {
            min: MIN_HEAD_DIM,
            max: MAX_HEAD_DIM,
            multiple_of: 8,
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
        stride_multiple_of: 8,
        gqa: true,
        max_seqlen: Some(MAX_SEQLEN),
        max_score_elements: None,
        backward: true,
        deterministic: true,
        features: Features {
            softcap: true,
            sinks: vec![SoftmaxKind::OffByOne, SoftmaxKind::Learnable],
            seqlens: vec![
                SeqPacking::PaddedRight,
                SeqPacking::PaddedLeft,
                SeqPacking::Packed,
            ],
        },
        notes: vec![
            "SM90 only (wgmma, sm_90a); NVRTC at run time, no headers".into(),
            "backward: P and dS from a fused score kernel, dQ/dK/dV by cuBLAS GEMMs (chunked plan)"
                .into(),
            "forward workspace: a transposed copy of V, b*h_kv*d_v*round_up(s_kv,64)*2 bytes"
                .into(),
            "backward workspace: per lane (2) P and dS of a chunk (4 bytes per score) and fp32 \
             dK/dV accumulators, within a 1 GiB budget, plus cuBLAS's"
                .into(),
            "strides and base pointers must be multiples of 8 elements (16 bytes)".into(),
            "deterministic: no atomics, fixed reduction order".into(),
            "soft-capping, off-by-one and learnable sinks: kernel variants (the plain kernel is \
             unchanged); d_sink by a fixed-order reduction"
                .into(),
            "per-sequence lengths (padded either side, packed THD): forward in one launch from a \
             per-sequence table in the workspace; backward one chunked backward plan per sequence"
                .into(),
            format!(
                "decode-shaped calls refused: fewer than {DECODE_FILL_TILES} query tiles of \
                 {BLOCK_M} rows against {DECODE_MIN_KEYS} keys or more (no split over the keys; \
                 chunked is faster there)"
            ),
        ],
    }
}

/// Longest sequence (either side): grid y holds the query tiles rounded up to whole clusters of
/// two (at most 65534 x 64 rows), and key indices are 32-bit in the kernel.
pub const MAX_SEQLEN: usize = 65534 * BLOCK_M;

/// The exact gate shared by the enabled and disabled builds (no device needed).
pub fn check_problem(p: &AttentionProblem) -> Result<(), Unsupported> {
    manifest().admits(p)?;
    let rows = p.batch * p.heads_q;
    if rows > i32::MAX as usize {
        return Err(Unsupported::new(format!(
            "batch * heads_q = {rows} above 2^31-1 (grid x)"
        )));
    }
    let kv_heads = p.batch_dim() * p.heads_kv;
    if kv_heads > 65535 {
        return Err(Unsupported::new(format!(
            "batch * heads_kv = {kv_heads} above 65535 (the V transpose's grid z)"
        )));
    }
    // Token indices of packed tensors are 32-bit in the kernels (and TMA coordinates).
    let tokens = p.rows_q().max(p.rows_kv()).max(seq_v_columns(p));
    if tokens.div_ceil(BLOCK_N) * BLOCK_N > i32::MAX as usize {
        return Err(Unsupported::new(format!(
            "{tokens} packed tokens above 2^31-1 (32-bit token indices)"
        )));
    }
    decode_gate(p, decode_fill_tiles()?)?;
    let (dqk, dv) = padded_dims(p.head_dim_qk, p.head_dim_v);
    let smem = shared_bytes(dqk, dv);
    if smem > MAX_SHARED_BYTES {
        return Err(Unsupported::new(format!(
            "shared memory {smem} bytes above the SM90 limit {MAX_SHARED_BYTES}"
        )));
    }
    Ok(())
}

/// A call with fewer query tiles than this ([`query_tiles`]: one CTA each, one CTA per SM) and
/// at least [`DECODE_MIN_KEYS`] keys is refused as decode-shaped. The forward has no split over
/// the keys, so such a call runs on a few SMs for as long as its keys last, while chunked's
/// GEMMs spread the keys over the whole GPU. The decode sweep (H100, docs/fused.md, "Decode
/// shapes") places it: at 16 tiles chunked is 1.6-1.95x faster from 16k keys on, at 64 tiles the
/// two are within 6%, from 256 tiles fused leads in all but one cell (6% behind). Half the 132
/// SMs sits at the low end of that crossover.
pub const DECODE_FILL_TILES: usize = 66;
/// See [`DECODE_FILL_TILES`]: below this many keys an underfilled call is short either way.
pub const DECODE_MIN_KEYS: usize = 16384;

/// Development hook for placing the decode boundary on measurements: a process with
/// `ATTN_POLICY_FUSED_DECODE_TILES=N` uses N instead of [`DECODE_FILL_TILES`] (0 admits every
/// decode shape, so a sweep can time fused on them). Read once.
pub const DECODE_TILES_ENV: &str = "ATTN_POLICY_FUSED_DECODE_TILES";

/// The decode boundary of this process; a value that is not a number refuses every call,
/// naming the variable (never silently the default).
fn decode_fill_tiles() -> Result<usize, Unsupported> {
    static FILL: std::sync::OnceLock<Result<usize, String>> = std::sync::OnceLock::new();
    FILL.get_or_init(|| parse_fill_tiles(std::env::var(DECODE_TILES_ENV)))
        .clone()
        .map_err(Unsupported::new)
}

/// [`DECODE_TILES_ENV`]'s value as the boundary: absent is [`DECODE_FILL_TILES`].
fn parse_fill_tiles(var: Result<String, std::env::VarError>) -> Result<usize, String> {
    match var {
        Err(std::env::VarError::NotPresent) => Ok(DECODE_FILL_TILES),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{DECODE_TILES_ENV}={v:?} is not a tile count")),
        Err(e) => Err(format!("{DECODE_TILES_ENV}: {e}")),
    }
}

/// Refuses a decode-shaped call ([`DECODE_FILL_TILES`]) at the boundary `fill`.
fn decode_gate(p: &AttentionProblem, fill: usize) -> Result<(), Unsupported> {
    let (tiles, keys) = (query_tiles(p), p.longest_seqs().1);
    if tiles < fill && keys >= DECODE_MIN_KEYS {
        return Err(Unsupported::new(format!(
            "decode-shaped: {tiles} query tiles of {BLOCK_M} rows (fewer than {fill}) \
             against {keys} keys leave most SMs idle, and the kernel has no split over the \
             keys; chunked is faster on such calls (docs/fused.md, \"Decode shapes\")"
        )));
    }
    Ok(())
}

/// Query tiles of [`BLOCK_M`] rows that carry work: per head, each sequence's query rows in
/// tiles (the whole batch's when there are no per-sequence lengths).
pub fn query_tiles(p: &AttentionProblem) -> usize {
    let per_head: usize = match &p.seqlens {
        Some(s) => s.q.iter().map(|&q| q.div_ceil(BLOCK_M)).sum(),
        None => p.batch * p.seqlen_q.div_ceil(BLOCK_M),
    };
    per_head * p.heads_q
}

/// Largest dynamic shared memory of one CTA on SM90 (227 KiB).
pub const MAX_SHARED_BYTES: usize = 232_448;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{DiagonalAlignment, MaskSpec, Strides};

    fn problem(d: usize, dv: usize) -> AttentionProblem {
        AttentionProblem::new(2, 8, 4, 1024, 1024, d, dv, DType::BF16)
    }

    #[test]
    fn every_head_dim_of_the_range_fits_shared_memory() {
        for d in (MIN_HEAD_DIM..=MAX_HEAD_DIM).step_by(8) {
            for dv in (MIN_HEAD_DIM..=MAX_HEAD_DIM).step_by(8) {
                assert_eq!(check_problem(&problem(d, dv)), Ok(()), "d {d} dv {dv}");
            }
        }
        assert_eq!(padded_dims(264, 264), (320, 320));
        assert_eq!(padded_dims(328, 392), (384, 448));
        assert_eq!(padded_dims(512, 512), (512, 512));
        assert!(shared_bytes(512, 512) <= MAX_SHARED_BYTES);
    }

    #[test]
    fn problems_outside_the_manifest_are_refused_with_the_reason() {
        let cases: Vec<(AttentionProblem, &str)> = vec![
            (problem(256, 256), "head_dim_qk 256 outside"),
            (problem(520, 512), "head_dim_qk 520 outside"),
            (problem(512, 128), "head_dim_v 128 outside"),
            (problem(300, 512), "head_dim_qk 300 outside"),
            (
                {
                    let mut p = problem(512, 512);
                    p.dtype = DType::F32;
                    p
                },
                "dtype fp32",
            ),
            (
                {
                    let mut p = problem(512, 512);
                    p.seqlen_q = MAX_SEQLEN + 1;
                    p.set_layout(LayoutKind::Bshd);
                    p
                },
                "sequence length above",
            ),
            (
                AttentionProblem::new(70000, 2, 1, 64, 64, 512, 512, DType::BF16),
                "batch * heads_kv = 70000 above 65535",
            ),
            (
                {
                    let mut p = problem(512, 512);
                    p.layout.k = Strides {
                        batch: 2054 * 1024,
                        head: 512,
                        seq: 2052 + 2,
                    };
                    p
                },
                "must be multiples of 8",
            ),
        ];
        for (p, want) in cases {
            let err = check_problem(&p).expect_err(want);
            assert!(
                err.reason.contains(want),
                "{want:?} not in {:?}",
                err.reason
            );
        }
        // Windows and both causal alignments are in.
        let p =
            problem(512, 512).with_mask(MaskSpec::window(128, 0, DiagonalAlignment::BottomRight));
        assert_eq!(check_problem(&p), Ok(()));
    }

    #[test]
    fn decode_shapes_that_leave_the_gpu_idle_are_refused() {
        use crate::problem::{SeqLens, SeqPacking};
        let decode = |b, hq, hkv, sq, skv| {
            AttentionProblem::new(b, hq, hkv, sq, skv, 512, 512, DType::BF16)
                .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
        };
        // The measured decode shapes (b2 hq8, 1..64 queries against 16k..64k keys): 16 tiles.
        for (sq, skv) in [(1, 65536), (16, 65536), (64, 16384), (64, 65536)] {
            let err = check_problem(&decode(2, 8, 4, sq, skv)).expect_err("decode");
            assert!(
                err.reason.contains("decode-shaped: 16 query tiles"),
                "{}",
                err.reason
            );
            assert!(err.reason.contains("chunked is faster"), "{}", err.reason);
        }
        // One tile short of half the GPU (65) is refused; 66 tiles are admitted.
        assert!(check_problem(&decode(1, 65, 1, 64, 16384)).is_err());
        assert_eq!(check_problem(&decode(1, 66, 1, 64, 16384)), Ok(()));
        assert_eq!(query_tiles(&decode(1, 33, 1, 65, 16384)), 66);
        assert_eq!(check_problem(&decode(1, 33, 1, 65, 16384)), Ok(()));
        // Shorter keys, or enough query tiles (a prefill, a large decode batch), are admitted.
        assert_eq!(check_problem(&decode(2, 8, 4, 64, 16383)), Ok(()));
        assert_eq!(check_problem(&decode(2, 8, 4, 16384, 16384)), Ok(()));
        assert_eq!(check_problem(&decode(8, 32, 8, 1, 65536)), Ok(()));
        // Per-sequence lengths count each sequence's own tiles and its own keys: 3 sequences of
        // 1 query (3 tiles per head) against a cache whose longest holds 20000 keys.
        let lens = SeqLens::padded(SeqPacking::PaddedLeft, vec![1, 1, 1], vec![100, 20000, 300]);
        let p = decode(3, 8, 4, 1, 20000).with_seqlens(lens, LayoutKind::Bshd);
        assert_eq!(query_tiles(&p), 24);
        let err = check_problem(&p).expect_err("padded decode");
        assert!(err.reason.contains("24 query tiles") && err.reason.contains("20000 keys"));
        let lens = SeqLens::padded(SeqPacking::PaddedLeft, vec![1, 1, 1], vec![100, 2000, 300]);
        let p = decode(3, 8, 4, 1, 20000).with_seqlens(lens, LayoutKind::Bshd);
        assert_eq!(check_problem(&p), Ok(()));
    }

    #[test]
    fn the_decode_boundary_can_be_moved_for_a_sweep_and_a_bad_value_is_named() {
        use std::env::VarError;
        assert_eq!(
            parse_fill_tiles(Err(VarError::NotPresent)),
            Ok(DECODE_FILL_TILES)
        );
        assert_eq!(parse_fill_tiles(Ok(" 0".into())), Ok(0));
        let err = parse_fill_tiles(Ok("many".into())).unwrap_err();
        assert!(
            err.contains(DECODE_TILES_ENV) && err.contains("\"many\""),
            "{err}"
        );
        // 16 tiles against 64k keys: admitted at a boundary of 0 or 16, refused at 17.
        let p = AttentionProblem::new(2, 8, 4, 1, 65536, 512, 512, DType::BF16);
        assert_eq!(decode_gate(&p, 0), Ok(()));
        assert_eq!(decode_gate(&p, 16), Ok(()));
        let err = decode_gate(&p, 17).unwrap_err();
        assert!(
            err.reason
                .contains("16 query tiles of 64 rows (fewer than 17)"),
            "{}",
            err.reason
        );
    }

    #[test]
    fn the_sequence_table_holds_rows_masks_and_aligned_v_columns() {
        use crate::problem::{SeqLens, SeqPacking};
        let p = AttentionProblem::new(3, 8, 4, 300, 700, 512, 512, DType::BF16)
            .with_mask(MaskSpec::CAUSAL_BOTTOM_RIGHT)
            .with_seqlens(
                SeqLens {
                    packing: SeqPacking::Packed,
                    q: vec![300, 0, 130],
                    kv: vec![700, 64, 1],
                },
                LayoutKind::Bshd,
            );
        assert_eq!(check_problem(&p), Ok(()));
        let t = seq_table(&p);
        // batch, q start, q len, kv start, kv len, offset (kv - q), V^T column, spare.
        assert_eq!(&t[..8], &[0, 0, 300, 0, 700, 400, 0, 0]);
        assert_eq!(&t[8..16], &[0, 300, 0, 700, 64, 64, 704, 0]);
        assert_eq!(&t[16..], &[0, 300, 130, 764, 1, -129, 768, 0]);
        assert_eq!(seq_v_columns(&p), 704 + 64 + 64);
        // V^T [h_kv, d_v, columns], then the table (3 x 32 bytes, one 256-byte block).
        assert_eq!(forward_workspace_bytes(&p), 4 * 512 * 832 * 2 + 256);
        // Padded: each sequence in its own batch row, left padding before it.
        let p = AttentionProblem::new(2, 2, 2, 100, 90, 320, 320, DType::F16).with_seqlens(
            SeqLens::padded(SeqPacking::PaddedLeft, vec![100, 7], vec![90, 33]),
            LayoutKind::Bshd,
        );
        let t = seq_table(&p);
        assert_eq!(&t[8..16], &[1, 93, 7, 57, 33, 0, 128, 0]);
        assert_eq!(seq_table(&problem(512, 512)), Vec::<i32>::new());
        assert_eq!(seq_table_bytes(&problem(512, 512)), 0);
    }

    #[test]
    fn the_workspace_is_the_transposed_v_padded_to_whole_key_tiles() {
        let mut p = problem(512, 384);
        p.seqlen_kv = 1000;
        p.set_layout(LayoutKind::Bshd);
        // 2 * 4 * 384 * 1024 keys * 2 bytes.
        assert_eq!(forward_workspace_bytes(&p), 2 * 4 * 384 * 1024 * 2);
    }
}
