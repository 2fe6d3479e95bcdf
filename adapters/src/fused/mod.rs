//! `fused`: fused attention kernels for head dims in (256, 512] on SM90 (H100/H200), written with
//! wgmma (warpgroup MMA) in inline PTX and compiled at run time by NVRTC for `sm_90a`.
//!
//! Forward (`kernels.cu`, `fused_fwd`): one CTA of three warpgroups per 64 query rows and query
//! head. The 512-wide output accumulator (64 x 512 fp32) does not fit one warpgroup, so two output
//! warpgroups each own half of the output columns; a score warpgroup holds Q in registers (the
//! columns past 384 in shared memory), computes S = Q K^T per key tile of 64, runs the online
//! softmax and hands P and the rescale factors to the output warpgroups through double-buffered
//! shared memory (mbarriers). Q in registers frees the shared memory for two K buffers, so the
//! score warpgroup runs ahead of the output warpgroups. The output warpgroups start P V of a tile
//! only once the scores of the next tile are done: the scores, the critical path, have the tensor
//! pipe alone, and P V runs under the next softmax. K and V tiles are loaded by TMA: clusters
//! of two CTAs (adjacent query tiles of one head) each load half of every tile and multicast it to
//! both, which halves the L2 traffic. V is read through a transposed copy in the workspace
//! (`transpose_v`, `[b, h_kv, d_v, s_kv rounded up to 64]`) so both GEMMs take K-major operands
//! from 128-byte-swizzled shared memory. Key tiles no query row of the pair admits are never
//! visited. `docs/fused.md` has the design, the measurements and what bounds the kernel.
//!
//! Backward (`backward.cu`, `bwd_scores`, driven by the chunked executor's backward plan of kind
//! `BackwardFusedScores`): per chunk of query rows, a persistent kernel computes S = Q K^T and
//! dP = dO V^T per 128 x 128 tile in registers and writes only P and dS (16-bit), where the chunked
//! executor writes S and dP in fp32, reads them back and writes P and dS. dQ, dK and dV then come
//! from the chunked plan's cuBLAS GEMMs (fp32 accumulation in a fixed order: deterministic).
//! Groups of (batch, KV head) alternate between two streams (`ChunkedConfig::fused_score_lanes`)
//! so one group's GEMMs run beside another's score kernel.

mod limits;
pub use limits::{
    BLOCK_M, BLOCK_N, COMPUTE_CAPABILITY, DECODE_FILL_TILES, DECODE_MIN_KEYS, DECODE_TILES_ENV,
    MAX_HEAD_DIM, MAX_SEQLEN, MAX_SHARED_BYTES, MIN_HEAD_DIM, NAME, SEQ_TABLE_INTS,
    backward_shared_bytes, check_problem, forward_workspace_bytes, manifest, padded_dims,
    query_tiles, seq_table, seq_table_bytes, seq_v_columns, shared_bytes, transposed_v_bytes,
};

#[cfg(feature = "cuda")]
mod enabled;
#[cfg(feature = "cuda")]
use enabled as runtime;
#[cfg(feature = "cuda")]
pub use enabled::{VariantKey, compile_only, kernel_source, kernel_source_for};

#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
use disabled as runtime;

pub use runtime::{Fused, availability};

use crate::executor::{ExecError, Executor};
use std::sync::Arc;

/// Registry constructor: opens CUDA device `ordinal`; fails with [`ExecError::NoDevice`] without
/// the `cuda` feature, a driver, NVRTC, or on a device other than compute capability 9.0.
pub fn create(ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Ok(Arc::new(Arc::new(Fused::on_device(ordinal)?)))
}

#[cfg(test)]
mod tests {
    /// The text of `src` from the first `from` up to the next `to` after it: the part of a kernel
    /// source a schedule check reads (the CPU build never compiles the kernels).
    fn section<'a>(src: &'a str, from: &str, to: &str) -> &'a str {
        let start = src
            .find(from)
            .unwrap_or_else(|| panic!("`{from}` not in the source"));
        let len = src[start..]
            .find(to)
            .unwrap_or_else(|| panic!("`{to}` not after `{from}`"));
        &src[start..start + len]
    }

    /// The schedule that made the forward 10-11% faster (docs/fused.md, "Where the targets
    /// stand"): in the output warpgroups' loop, P V of tile `it` is issued only after waiting for
    /// "K slot empty" of tile `it + 1` (its scores done), and only when there is a next tile (the
    /// last tile has no next scores to wait for). Guarded here because the CPU build never
    /// compiles the kernel, and a reordering would still pass every numerics test.
    #[test]
    fn the_output_loop_issues_p_v_after_the_next_tiles_scores() {
        let body = section(
            include_str!("kernels.cu"),
            "// ---- Output warpgroup",
            "// Epilogue",
        );
        let at = |needle: &str| {
            body.find(needle)
                .unwrap_or_else(|| panic!("`{needle}` not in the output loop"))
        };
        let p_full = at("mbar_wait(PFULL(ps)");
        let next_scores = at("mbar_wait(KEMPTY((it + 1) & 1)");
        let p_v = at("wg_ss_o(");
        assert!(p_full < next_scores && next_scores < p_v);
        let line_start = body[..next_scores].rfind('\n').map_or(0, |i| i + 1);
        assert!(body[line_start..next_scores].contains("if (it + 1 < ntiles)"));
    }

    /// The backward score kernel's walk order, which made forward+backward 4.4% faster at s=32k
    /// (docs/fused.md, "Where the backward's time goes"): the query-tile pair varies fastest and
    /// the key tile slowest, so the clusters running at once share their K/V tiles while L2
    /// holds them. Key tile fastest computes the same tiles (every numerics test passes) but
    /// reads K and V from DRAM once per query pair; only this check notices.
    #[test]
    fn the_score_kernel_walks_query_pairs_fastest_and_key_tiles_slowest() {
        let src = include_str!("backward.cu");
        let body = section(src, "BUnit unit_of(", "\n}");
        let lines: Vec<&str> = body.lines().map(str::trim).collect();
        for expected in [
            "x.qp = u % qpairs;",
            "x.r = (u / qpairs) % heads;",
            "x.kt = u / (qpairs * heads);",
        ] {
            assert!(
                lines.contains(&expected),
                "unit_of does not assign `{expected}`"
            );
        }
        // Both warp roles walk the same order (the producer's loads and the consumers' tiles
        // must agree unit by unit).
        assert_eq!(src.matches("unit_of(u, ktiles, qpairs, units)").count(), 2);
    }
}
