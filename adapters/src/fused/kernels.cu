// NVRTC kernels of the fused executor (SM90: wgmma). Compiled at run time for `sm_90a` once per
// (dtype, padded head dims); the host prepends:
//   LOWP_BF16   1 for bf16, 0 for fp16
//   DQK         Q/K head dim padded to a multiple of 64 (one 128-byte swizzle atom)
//   DV          V head dim padded to a multiple of 64 (each output warpgroup owns DV/2 columns)
//   SMEM_BYTES  the dynamic shared memory the launch allocates (fused::shared_bytes)
//   SEQ         1: per-sequence lengths (a table in device memory, 8 ints per sequence: tensor
//               batch, q start, q len, kv start, kv len, diagonal offset, first V^T column;
//               fused::SEQ_TABLE_INTS)
//   SOFTCAP     1: scores become c tanh(scale s / c) before the mask and the softmax
// (both 0 for the plain kernel, whose code is unchanged by them)
//   wg_rs_s / wg_ss_s / wg_ss_o: the wgmma wrappers (generated: their operand lists are 32..128
//               long)
// and ../nvrtc_prelude.cu (types, conversions, row_range). No CUDA headers: conversions,
// barriers and copies are inline PTX.
//
// Forward: one CTA of three warpgroups per (64 query rows, query head, batch).
//   warpgroup 0, the score warpgroup: holds Q (64 x DQK) in registers, computes S = Q K^T for
//     each key tile (wgmma, A from registers, K from shared memory), runs the online softmax and
//     writes the probabilities P (bf16/fp16) and the rescale factors to shared memory;
//   warpgroups 1 and 2, the output warpgroups: warpgroup 1 + g accumulates output columns
//     [g * DV/2, (g + 1) * DV/2) of O += P V (wgmma, both operands from shared memory).
// The 512-wide fp32 output accumulator (128 KiB) does not fit one warpgroup's registers, hence
// two output warpgroups; keeping Q in registers frees the 64 KiB of shared memory that pays for
// a second K buffer, so the score warpgroup runs up to two key tiles ahead of the output ones.
// Clusters of two CTAs (adjacent query tiles of one head) share every K and V tile: K tiles are
// loaded half by each CTA, V tiles half (the columns of one output warpgroup) by each CTA, with
// TMA multicast into both CTAs' shared memory, which halves the L2 traffic.
//
// Pipeline (mbarriers; "x2" = double-buffered, "cl" = arrivals from both CTAs of the cluster):
//   kfull[s]  K slot s landed (TMA bytes)       kempty[s] cl: both CTAs' score warps are done
//             (then output warpgroup 0's thread 0 loads the slot's next tile: the output
//             warpgroups wait for P anyway, the score warpgroup is the critical path)
//   vfull[g]  V half g landed (TMA bytes)       vempty[g] cl: both CTAs' output warpgroup g done
//   pfull[s]  P, alpha of slot s written        pempty[s] both output warpgroups done with slot s

#define BM 64                 // query rows per CTA
#define BN 64                 // keys per tile
#define DVH (DV / 2)          // output columns per output warpgroup
#define OREGS (DVH / 2)       // fp32 accumulator registers per thread for O (m64 x DVH)
// Q columns [0, QR) live in the score warpgroup's registers (QR / 4 per thread); the rest, at most
// 128 columns, in shared memory: all of a 512-wide Q would take 128 of the 168 registers a thread
// of a 384-thread CTA has.
#define QSM (DQK > 384 ? DQK - 384 : 0)
#define QR (DQK - QSM)
#define QREGS (QR / 4)
#define NTHREADS 384
#ifndef LOG2E
#define LOG2E 1.4426950408889634f
#endif
#ifndef SEQ
#define SEQ 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
// Ints per sequence of the table (fused::SEQ_TABLE_INTS): tensor batch, q start, q len,
// kv start, kv len, diagonal offset (kv len - q len for a bottom-right diagonal), first column
// of the sequence's keys in V^T (transpose_v_seq), one spare.
#define SEQ_INTS 8

// Shared memory (bytes from a 1024-aligned base). Operand tiles use the 128-byte swizzle wgmma
// descriptors expect: 64-column atoms of 8 rows x 128 B, 16-byte chunk c of row r stored at
// chunk c ^ (r % 8).
#define KTILE (BN * DQK * 2)
#define PTILE (BM * BN * 2)
#define SK_OFF 0                          // two K tiles
#define SV_OFF (2 * KTILE)                // one V^T tile (DV rows x 64 keys)
#define SP_OFF (SV_OFF + DV * BN * 2)     // two P tiles (64 x 64, one atom each)
#define SQ_OFF (SP_OFF + 2 * PTILE)       // Q columns [QR, DQK) (64 x QSM)
#define SA_OFF (SQ_OFF + BM * QSM * 2)    // two alpha vectors (64 floats each)
#define SL_OFF (SA_OFF + 2 * BM * 4)      // 1 / l per row
#define SBAR_OFF (SL_OFF + BM * 4)        // 12 mbarriers
#define SMEM_USED (SBAR_OFF + 12 * 8)
// The host's figure (fused::shared_bytes) repeats this layout: fail the compile, not the launch,
// if the two ever disagree (the base is rounded up to 1024 inside the allocation).
static_assert(SMEM_USED + 1024 <= SMEM_BYTES, "fused::shared_bytes is smaller than the kernel's layout");

// A CUtensorMap (TMA descriptor) as the driver encodes it, passed by value as a kernel parameter.
struct __align__(128) TmapT {
    u64 x[16];
};

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
// Named barrier 1 over all three warpgroups (0 is __syncthreads).
__device__ __forceinline__ void all_warpgroups_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(NTHREADS) : "memory");
}
__device__ __forceinline__ void mbar_init(unsigned a, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned a, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a)
                 : "memory");
}
// Arrive on the barrier at the same offset in CTA `rank` of the cluster (may be this one). Used
// only to say "done reading a buffer" (the reads were wgmma operands, complete once
// wgmma.wait_group returned), so the default CTA-scope semantics suffice: a cluster-scope
// release here compiles to a full memory barrier (ERRBAR) that took a third of the score
// warpgroup's time.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned a, unsigned rank) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(a),
        "r"(rank)
        : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned a, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    }
}
// TMA tile loads (tiled mode, 128-byte swizzle in the map), multicast to CTAs 0 and 1.
__device__ __forceinline__ void tma4_mc(unsigned dst, const TmapT* map, int c0, int c1, int c2,
                                        int c3, unsigned mbar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(mbar), "h"((unsigned short)3)
        : "memory");
}
__device__ __forceinline__ void tma3_mc(unsigned dst, const TmapT* map, int c0, int c1, int c2,
                                        unsigned mbar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(mbar), "h"((unsigned short)3)
        : "memory");
}

// Shared-memory writes by threads are generic-proxy writes; wgmma reads through the async proxy.
__device__ __forceinline__ void fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Shared-memory matrix descriptors: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
// Descriptors are built from the low word only: the start address (bits 0..13, 16-byte units)
// plus the leading-byte-offset field; the high word (stride 1024 B, 128-byte swizzle) is the
// same for every operand here. The low word of `bytes` further on just grows, without a carry,
// since every shared-memory address is below 256 KiB, so a k-loop adds constants to a word
// computed once per buffer instead of rebuilding each descriptor (a third of the score
// warpgroup's instructions in the profile).
__device__ __forceinline__ unsigned sdesc_lo(unsigned saddr) {
    return ((saddr & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ u64 sdesc_at(unsigned lo, unsigned bytes) {
    return ((u64)((1024 >> 4) | (1u << 30)) << 32) | (u64)(lo + (bytes >> 4));
}
// Four 8 x 8 b16 matrices of a warp's accumulator fragments to shared memory (thread l gives
// the address of row l % 8 of matrix l / 8).
__device__ __forceinline__ void stmatrix4(unsigned addr, unsigned r0, unsigned r1, unsigned r2,
                                          unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// Two floats rounded to bf16/fp16 in one instruction, `a` in the low half (as pack2).
__device__ __forceinline__ unsigned pack2x(float a, float b) {
    unsigned r;
#if LOWP_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
#endif
    return r;
}

// 2^x for x <= 0 (ex2.approx, relative error ~2^-22; results below 2^-126 flush to 0). exp2f
// wraps the same instruction in a denormal-range fix-up the probabilities do not need.
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Issued by one thread of each CTA of the pair: its half of key tile j (rows [32 rank, 32 rank +
// 32) of every 64-column atom) multicast to both CTAs; the CTA's own barrier expects the whole
// tile (both halves land in its shared memory). K's map is 4-D (d, then the row, head and batch
// dimensions in the order `pos` gives: slot 1..3 of each).
__device__ __forceinline__ void issue_k(unsigned sK, const TmapT* tmk, int j, int hk, int b,
                                        unsigned rank, unsigned mbar, int pos_row, int pos_head,
                                        int row0) {
    mbar_expect_tx(mbar, KTILE);
    const int row = row0 + j * BN + (int)rank * (BN / 2);
    int c[4];
    c[1] = pos_row == 1 ? row : (pos_head == 1 ? hk : b);
    c[2] = pos_row == 2 ? row : (pos_head == 2 ? hk : b);
    c[3] = pos_row == 3 ? row : (pos_head == 3 ? hk : b);
#pragma unroll
    for (int a = 0; a < DQK / 64; a++) {
        tma4_mc(sK + a * (BN * 128) + rank * (BN / 2) * 128, tmk, a * 64, c[1], c[2], c[3], mbar);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) fused_fwd(
    const __grid_constant__ TmapT tmk, const __grid_constant__ TmapT tmv,
    const u16* __restrict__ Q, u16* __restrict__ O, float* __restrict__ LSE, int sq_all,
    int skv_all, int hq, int group, int dqk, int dv, i64 q_sb, i64 q_sh, i64 q_ss, i64 o_sb,
    i64 o_sh, i64 o_ss, i64 off_all, i64 left, i64 right, float scale_log2, int pos_row,
    int pos_head, float cap_in, float cap_out, int sink_mode, const float* __restrict__ sink,
    const int* __restrict__ seqtab, i64 lse_rows) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned sbase = (raw + 1023u) & ~1023u;
    unsigned char* sm = smem_raw + (sbase - raw);
    const unsigned sK = sbase + SK_OFF, sV = sbase + SV_OFF, sP = sbase + SP_OFF;
    float* alpha_s = reinterpret_cast<float*>(sm + SA_OFF);
    float* linv_s = reinterpret_cast<float*>(sm + SL_OFF);
    const unsigned bars = sbase + SBAR_OFF;
#define KFULL(s) (bars + 8 * (s))
#define KEMPTY(s) (bars + 16 + 8 * (s))
#define VFULL(g) (bars + 32 + 8 * (g))
#define VEMPTY(g) (bars + 48 + 8 * (g))
#define PFULL(s) (bars + 64 + 8 * (s))
#define PEMPTY(s) (bars + 80 + 8 * (s))

#if SEQ
    // One sequence of the table per group of hq CTAs along x; rows and keys are the sequence's
    // own (0 at its first token), q0 / k0 its first rows in the tensors.
    const int* te = seqtab + SEQ_INTS * (blockIdx.x / hq);
    const int b = te[0], q0 = te[1], sq = te[2], k0 = te[3], skv = te[4];
    const i64 off = te[5];
#define KROW0 k0
// V^T columns of the sequence start at te[6] (a multiple of 64), one [dv, cols] slab per KV head.
#define VCOL0 te[6]
#define VBH hk
#else
    const int b = blockIdx.x / hq;
    const int sq = sq_all, skv = skv_all;
    const i64 off = off_all;
#define KROW0 0
#define VCOL0 0
#define VBH (b * hkv + hk)
#endif
    const int h = blockIdx.x % hq, hk = h / group;
    const int hkv = hq / group;
    const int m0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;
    const unsigned rank = cluster_rank();
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = t & 31;
    // The local row (0..63) of this thread's first accumulator row; the second is 8 below.
    const int lrow0 = 16 * warp + (lane >> 2);

    // Key tiles the pair's rows admit (ranges are monotone in the row); identical in both CTAs.
    const int pair_lo = (int)(gridDim.y - 2 - (blockIdx.y & ~1u)) * BM;
    const int pair_end = pair_lo + 2 * BM < sq ? pair_lo + 2 * BM : sq;
    i64 lo0, hi0, lo1, hi1;
    row_range(pair_lo, off, left, right, skv, &lo0, &hi0);
    row_range(pair_end - 1, off, left, right, skv, &lo1, &hi1);
    const int jlo = (int)(lo0 / BN);
    const int jhi = hi1 > lo0 ? (int)((hi1 + BN - 1) / BN) : jlo;
#if SEQ
    // The grid covers the longest sequence: pairs past this one's rows have nothing to do.
    const int ntiles = pair_lo < sq ? jhi - jlo : 0;
#else
    const int ntiles = jhi - jlo;
#endif

    if (tid == 0) {
        // Arrival counts: "full" barriers one (the local expect_tx; TMA adds the bytes), K and V
        // "empty" eight (four warps in each CTA), P "full" the four score warps, P "empty" the
        // eight output warps.
#pragma unroll
        for (int x = 0; x < 2; x++) {
            mbar_init(KFULL(x), 1);
            mbar_init(KEMPTY(x), 8);
            mbar_init(VFULL(x), 1);
            mbar_init(VEMPTY(x), 8);
            mbar_init(PFULL(x), 4);
            mbar_init(PEMPTY(x), 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // Both CTAs' barriers exist before either multicasts into or arrives on the other.
    cluster_sync();

    if (wg == 0) {
        // ---- Score warpgroup ----
        if (t == 0 && ntiles > 0) {
            issue_k(sK, &tmk, jlo, hk, b, rank, KFULL(0), pos_row, pos_head, KROW0);
            if (ntiles > 1) issue_k(sK + KTILE, &tmk, jlo + 1, hk, b, rank, KFULL(1), pos_row, pos_head, KROW0);
        }
        __syncwarp();  // wgmma (.aligned) needs the warp converged again
        // This thread's two rows and their key ranges (empty past the end).
        int rlo[2], rhi[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = m0 + lrow0 + 8 * rr;
            i64 lo = 0, hi = 0;
            if (row < sq) row_range(row, off, left, right, skv, &lo, &hi);
            rlo[rr] = (int)lo;
            rhi[rr] = (int)hi;
        }
        // Q columns [0, QR) as wgmma A fragments: k-step kk, register 4kk + 2 half + rr holds row
        // lrow0 + 8 rr, columns 16 kk + 8 half + 2 (lane % 4) + {0, 1}. Zero past the ends.
#if SEQ
        const u16* q = Q + b * q_sb + h * q_sh + (i64)q0 * q_ss;
#else
        const u16* q = Q + b * q_sb + h * q_sh;
#endif
        unsigned qa[QREGS];
#pragma unroll
        for (int kk = 0; kk < QR / 16; kk++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int col = 16 * kk + 8 * half + 2 * (lane & 3);
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int row = m0 + lrow0 + 8 * rr;
                    qa[4 * kk + 2 * half + rr] =
                        (row < sq && col < dqk)
                            ? *reinterpret_cast<const unsigned*>(q + (i64)row * q_ss + col)
                            : 0u;
                }
            }
        }
#if QSM > 0
        // Q columns [QR, DQK) into swizzled atoms of shared memory (16-byte chunks).
        for (int idx = t; idx < BM * (QSM / 8); idx += 128) {
            const int r = idx / (QSM / 8), c = idx % (QSM / 8);
            const int row = m0 + r, col = QR + 8 * c;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (row < sq && col < dqk) v = *reinterpret_cast<const uint4*>(q + (i64)row * q_ss + col);
            *reinterpret_cast<uint4*>(sm + SQ_OFF + (c >> 3) * (BM * 128) + r * 128 +
                                      (((c & 7) ^ (r & 7)) << 4)) = v;
        }
        fence_async_smem();
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
#endif
        const unsigned dK0 = sdesc_lo(sK), dQs = sdesc_lo(sbase + SQ_OFF);
        float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
        for (int it = 0; it < ntiles; ++it) {
            const int j = jlo + it, ks = it & 1;
            mbar_wait(KFULL(ks), (unsigned)(it >> 1) & 1u);
            __syncwarp();
            float s[32];
#pragma unroll
            for (int i = 0; i < 32; i++) s[i] = 0.f;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++) {
                const u64 db = sdesc_at(dK0, ks * KTILE + (kk >> 2) * (BN * 128) + (kk & 3) * 32);
                if (kk < QR / 16) {
                    wg_rs_s(s, qa[4 * kk + 0], qa[4 * kk + 1], qa[4 * kk + 2], qa[4 * kk + 3], db);
                } else {
                    const int kq = kk - QR / 16;
                    wg_ss_s(s, sdesc_at(dQs, (kq >> 2) * (BM * 128) + (kq & 3) * 32), db, 1);
                }
            }
            wg_commit();
            wg_wait0();
#pragma unroll
            for (int i = 0; i < 32; i++) fence_reg(s[i]);
            __syncwarp();
            if (lane == 0) {
                mbar_arrive_cluster(KEMPTY(ks), 0);
                mbar_arrive_cluster(KEMPTY(ks), 1);
            }
#if SOFTCAP
            // Soft-capping before the mask: s becomes c tanh(scale s / c) in log2 units
            // (cap_in = scale / c, cap_out = c log2(e)); the host passes scale_log2 = 1.
#pragma unroll
            for (int i = 0; i < 32; i++) s[i] = cap_out * tanhf(s[i] * cap_in);
#endif

            // Mask, online softmax (base 2), on raw scores: p = 2^(s * scale_log2 - m) with m the
            // running max of s * scale_log2. Element 4i+e: row rr = e >> 1, key
            // j*BN + 8i + 2(lane%4) + e%2. Tiles both rows admit whole skip the per-element mask.
            const int n0 = j * BN;
            if (!(n0 >= rlo[0] && n0 + BN <= rhi[0] && n0 >= rlo[1] && n0 + BN <= rhi[1])) {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int col = n0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
                    const int rr = (i >> 1) & 1;
                    if (col < rlo[rr] || col >= rhi[rr]) s[i] = NEG_INF;
                }
            }
            // Row maxima as trees (depth 4, not a chain of 16: the score warpgroup is
            // latency-bound, one warp per scheduler).
            float tmax[2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                float m8[8];
#pragma unroll
                for (int i = 0; i < 8; i++) m8[i] = fmaxf(s[4 * i + 2 * rr], s[4 * i + 2 * rr + 1]);
#pragma unroll
                for (int w = 4; w >= 1; w >>= 1) {
#pragma unroll
                    for (int i = 0; i < w; i++) m8[i] = fmaxf(m8[i], m8[i + w]);
                }
                tmax[rr] = m8[0];
            }
#pragma unroll
            for (int rr = 0; rr < 2; rr++) tmax[rr] *= scale_log2;  // -inf stays -inf
            float alpha[2], mbase[2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                tmax[rr] = fmaxf(tmax[rr], __shfl_xor_sync(0xffffffffu, tmax[rr], 1));
                tmax[rr] = fmaxf(tmax[rr], __shfl_xor_sync(0xffffffffu, tmax[rr], 2));
                const float mnew = fmaxf(mrow[rr], tmax[rr]);
                alpha[rr] = mnew == NEG_INF ? 1.f : exp2_approx(mrow[rr] - mnew);
                mbase[rr] = mnew == NEG_INF ? 0.f : mnew;
                mrow[rr] = mnew;
                lrow[rr] *= alpha[rr];
            }
#pragma unroll
            for (int i = 0; i < 32; i++) {
                s[i] = exp2_approx(fmaf(s[i], scale_log2, -mbase[(i >> 1) & 1]));
            }
            // Row sums as trees too (a fixed order: still deterministic).
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                float l8[8];
#pragma unroll
                for (int i = 0; i < 8; i++) l8[i] = s[4 * i + 2 * rr] + s[4 * i + 2 * rr + 1];
#pragma unroll
                for (int w = 4; w >= 1; w >>= 1) {
#pragma unroll
                    for (int i = 0; i < w; i++) l8[i] += l8[i + w];
                }
                lrow[rr] += l8[0];
            }
            // P slot `ps` is free once both output warpgroups finished tile it - 2.
            const int ps = it & 1;
            if (it >= 2) mbar_wait(PEMPTY(ps), (unsigned)((it >> 1) - 1) & 1u);
            __syncwarp();
            // Matrix (i, rr) = rows 16 warp + 8 rr .. + 8, keys 8 i .. + 8: 16-byte chunk i of its
            // rows, swizzled (chunk ^ row % 8; row % 8 = lane % 8 for the lane giving the address).
            const unsigned pt = sP + ps * PTILE;
            const int mq = lane >> 3;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int i = 2 * m + (mq >> 1);
                const int r = 16 * warp + 8 * (mq & 1) + (lane & 7);
                const unsigned addr = pt + r * 128 + ((unsigned)(i ^ (lane & 7)) << 4);
                stmatrix4(addr, pack2x(s[8 * m + 0], s[8 * m + 1]), pack2x(s[8 * m + 2], s[8 * m + 3]),
                          pack2x(s[8 * m + 4], s[8 * m + 5]), pack2x(s[8 * m + 6], s[8 * m + 7]));
            }
            if ((lane & 3) == 0) {
                alpha_s[ps * BM + lrow0] = alpha[0];
                alpha_s[ps * BM + lrow0 + 8] = alpha[1];
            }
            fence_async_smem();
            __syncwarp();
            if (lane == 0) mbar_arrive(PFULL(ps));
        }
        // LSE = ln(sum exp), -inf for rows with no admitted key; 1 / l for the output warpgroups.
        // A sink (sink_mode 1: logit 0, 2: sink[h]) adds exp(s_h) to the sum of every row that
        // admits a key, taken relative to max(m, s_h) so a large sink cannot overflow.
        const float sink_l2 = sink_mode == 2 ? sink[h] * LOG2E : 0.f;
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float l = lrow[rr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if ((lane & 3) == 0) {
                const int row = m0 + lrow0 + 8 * rr;
                float linv = l > 0.f ? 1.f / l : 0.f;
                float lse = l > 0.f ? (mrow[rr] + log2f(l)) * LN2 : NEG_INF;
                if (sink_mode != 0 && l > 0.f) {
                    const float mm = fmaxf(mrow[rr], sink_l2);
                    const float sc = exp2_approx(mrow[rr] - mm);
                    const float lt = fmaf(l, sc, exp2_approx(sink_l2 - mm));
                    linv = sc / lt;
                    lse = (mm + log2f(lt)) * LN2;
                }
                linv_s[lrow0 + 8 * rr] = linv;
                if (row < sq) {
#if SEQ
                    LSE[((i64)b * hq + h) * lse_rows + q0 + row] = lse;
#else
                    LSE[((i64)b * hq + h) * sq + row] = lse;
#endif
                }
            }
        }
        all_warpgroups_sync();
    } else {
        // ---- Output warpgroup 1 + g: O[:, g*DVH .. (g+1)*DVH) ----
        const int g = wg - 1;
        const int bh = VBH;
        const unsigned vdst = sV + g * DVH * 128;
        // Thread 0 of the warpgroup posts the expected bytes of each V half-tile on its CTA's
        // barrier; in CTA `g` it also issues the load, multicast to both CTAs.
        const bool lead = t == 0;
        if (lead && ntiles > 0) {
            mbar_expect_tx(VFULL(g), DVH * BN * 2);
            if ((int)rank == g) tma3_mc(vdst, &tmv, VCOL0 + jlo * BN, g * DVH, bh, VFULL(g));
        }
        const unsigned dP0 = sdesc_lo(sP), dV0 = sdesc_lo(vdst);
        float o[OREGS];
#pragma unroll
        for (int i = 0; i < OREGS; i++) o[i] = 0.f;
        for (int it = 0; it < ntiles; ++it) {
            const int j = jlo + it, ps = it & 1;
            // K slot `ps` takes tile j + 2 as soon as both CTAs' score warps are done with tile
            // j, issued here (the output warpgroups wait for P anyway) rather than by the score
            // warpgroup, whose thread 0 would wait for the other CTA on the critical path, a
            // softmax later.
            if (lead && g == 0 && j + 2 < jhi) {
                mbar_wait(KEMPTY(ps), (unsigned)(it >> 1) & 1u);
                issue_k(sK + ps * KTILE, &tmk, j + 2, hk, b, rank, KFULL(ps), pos_row, pos_head,
                        KROW0);
            }
            __syncwarp();
            mbar_wait(PFULL(ps), (unsigned)(it >> 1) & 1u);
            const float a0 = alpha_s[ps * BM + lrow0], a1 = alpha_s[ps * BM + lrow0 + 8];
            if (a0 != 1.f || a1 != 1.f) {
#pragma unroll
                for (int i = 0; i < OREGS / 4; i++) {
                    o[4 * i + 0] *= a0;
                    o[4 * i + 1] *= a0;
                    o[4 * i + 2] *= a1;
                    o[4 * i + 3] *= a1;
                }
            }
            mbar_wait(VFULL(g), (unsigned)it & 1u);
            // P V of tile j waits until the scores of tile j + 1 are done (their K slot freed):
            // the scores, the critical path, get the tensor pipe alone, and P V runs under the
            // next softmax (H100: forward 10-11% faster). No deadlock: those scores need only
            // K, loaded two tiles ahead, and the P slot they next fill was freed a tile earlier.
            if (it + 1 < ntiles) mbar_wait(KEMPTY((it + 1) & 1), (unsigned)((it + 1) >> 1) & 1u);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < OREGS; i++) fence_reg(o[i]);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                wg_ss_o(o, sdesc_at(dP0, ps * PTILE + kk * 32), sdesc_at(dV0, kk * 32), 1);
            }
            wg_commit();
            wg_wait0();
#pragma unroll
            for (int i = 0; i < OREGS; i++) fence_reg(o[i]);
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(PEMPTY(ps));
                mbar_arrive_cluster(VEMPTY(g), (unsigned)g);
            }
            if (lead && j + 1 < jhi) {
                mbar_expect_tx(VFULL(g), DVH * BN * 2);
                if ((int)rank == g) {
                    mbar_wait(VEMPTY(g), (unsigned)it & 1u);
                    tma3_mc(vdst, &tmv, VCOL0 + (j + 1) * BN, g * DVH, bh, VFULL(g));
                }
            }
            __syncwarp();
        }
        all_warpgroups_sync();
        // Epilogue: O = acc / l (0 for rows with no admitted key).
        const float inv[2] = {linv_s[lrow0], linv_s[lrow0 + 8]};
#if SEQ
        u16* ob = O + b * o_sb + h * o_sh + (i64)q0 * o_ss;
#else
        u16* ob = O + b * o_sb + h * o_sh;
#endif
#pragma unroll
        for (int i = 0; i < OREGS / 4; i++) {
            const int col = g * DVH + 8 * i + 2 * (lane & 3);
            if (col < dv) {
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int row = m0 + lrow0 + 8 * rr;
                    if (row < sq) {
                        *reinterpret_cast<unsigned*>(ob + (i64)row * o_ss + col) =
                            pack2(o[4 * i + 2 * rr] * inv[rr], o[4 * i + 2 * rr + 1] * inv[rr]);
                    }
                }
            }
        }
    }
    // Neither CTA leaves while the other may still arrive on its barriers.
    cluster_sync();
#undef KFULL
#undef KEMPTY
#undef VFULL
#undef VEMPTY
#undef PFULL
#undef PEMPTY
#undef KROW0
#undef VCOL0
#undef VBH
}

// V [b, h_kv, s_kv, dv] (strides sb, sh, ss; dv contiguous) -> V^T [b, h_kv, dv, skv_pad]
// contiguous, keys past s_kv zero. Block 32 x 8, one 32 x 32 tile.
extern "C" __global__ void __launch_bounds__(256) transpose_v(
    const u16* __restrict__ V, u16* __restrict__ Vt, int skv, int skv_pad, int dv, int hkv,
    i64 sb, i64 sh, i64 ss) {
    __shared__ u16 tile[32][34];
    const int bh = blockIdx.z, b = bh / hkv, h = bh % hkv;
    const int key0 = blockIdx.x * 32, d0 = blockIdx.y * 32;
    const u16* v = V + b * sb + h * sh;
    u16* out = Vt + (i64)bh * dv * skv_pad;
    for (int y = threadIdx.y; y < 32; y += 8) {
        const int key = key0 + y, d = d0 + threadIdx.x;
        tile[y][threadIdx.x] = (key < skv && d < dv) ? v[(i64)key * ss + d] : (u16)0;
    }
    __syncthreads();
    for (int y = threadIdx.y; y < 32; y += 8) {
        const int d = d0 + y, key = key0 + threadIdx.x;
        if (d < dv && key < skv_pad) out[(i64)d * skv_pad + key] = tile[threadIdx.x][y];
    }
}

// ---- Per-sequence lengths, sinks: small kernels around the main ones ----

// Per-sequence lengths: V -> V^T [h_kv, dv, cols], sequence s in columns [vcol_s, vcol_s +
// round_up(kv_len_s, 64)) (table entry 6), so every key tile starts at a multiple of 64 columns:
// a TMA box must start 16-byte aligned in its innermost dimension, which a sequence's first key
// in the tensors need not be. Columns past a sequence's keys are zero (their probabilities are
// 0, but 0 times a NaN in padding memory would not be).
extern "C" __global__ void __launch_bounds__(256) transpose_v_seq(
    const u16* __restrict__ V, u16* __restrict__ Vt, int cols, int dv, const int* __restrict__ tab,
    int nseq, i64 sb, i64 sh, i64 ss) {
    __shared__ u16 tile[32][34];
    const int hk = blockIdx.z;
    const int col0 = blockIdx.x * 32, d0 = blockIdx.y * 32;
    u16* out = Vt + (i64)hk * dv * cols;
    for (int y = threadIdx.y; y < 32; y += 8) {
        const int col = col0 + y, d = d0 + threadIdx.x;
        u16 x = 0;
        if (col < cols && d < dv) {
            // The last sequence whose columns start at or before col owns it.
            int lo = 0, hi = nseq - 1;
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (tab[SEQ_INTS * mid + 6] <= col) lo = mid; else hi = mid - 1;
            }
            const int* te = tab + SEQ_INTS * lo;
            const int key = col - te[6];
            if (key >= 0 && key < te[4]) {
                x = V[te[0] * sb + hk * sh + (i64)(te[3] + key) * ss + d];
            }
        }
        tile[y][threadIdx.x] = x;
    }
    __syncthreads();
    for (int y = threadIdx.y; y < 32; y += 8) {
        const int d = d0 + y, col = col0 + threadIdx.x;
        if (d < dv && col < cols) out[(i64)d * cols + col] = tile[threadIdx.x][y];
    }
}

// One chunk of the sequence table (SEQ_INTS ints per sequence), passed by value and written to
// device memory the call's workspace holds: capture-safe, no host copy.
#define SEQ_CHUNK_INTS 896
struct SeqChunk {
    int v[SEQ_CHUNK_INTS];
};
extern "C" __global__ void seq_table_write(int* __restrict__ dst, int n, const SeqChunk chunk) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = chunk.v[i];
}

__device__ __forceinline__ float lowf(u16 x) {
#if LOWP_BF16
    return __uint_as_float((unsigned)x << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
}

// Does row `row` of tensor batch `b` belong to a sequence with queries and keys (side 0: query
// rows, 1: key rows)? Padded tensors: sequence b; packed: the last sequence starting at or
// before the row (starts do not decrease).
__device__ __forceinline__ bool seq_row_live(const int* tab, int nseq, int packed, int b, int row,
                                             int side) {
    int s = b;
    if (packed) {
        int lo = 0, hi = nseq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tab[SEQ_INTS * mid + 1 + 2 * side] <= row) lo = mid; else hi = mid - 1;
        }
        s = lo;
    }
    const int* te = tab + SEQ_INTS * s;
    const int st = te[1 + 2 * side], len = te[2 + 2 * side];
    return row >= st && row < st + len && te[2] > 0 && te[4] > 0;
}

// Padding rows of padded tensors (outside batch b's sequence): O = 0, LSE = -inf.
extern "C" __global__ void __launch_bounds__(256) seq_pad_fwd(
    u16* __restrict__ O, float* __restrict__ LSE, const int* __restrict__ seqtab, int nb, int hq,
    int rows, int dv, i64 sb, i64 sh, i64 ss) {
    const int chunks = dv / 8;
    const i64 total = (i64)nb * hq * rows * chunks;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const int c = (int)(idx % chunks);
        i64 r = idx / chunks;
        const int row = (int)(r % rows);
        r /= rows;
        const int h = (int)(r % hq), b = (int)(r / hq);
        const int* te = seqtab + SEQ_INTS * b;
        if (row >= te[1] && row < te[1] + te[2]) continue;
        *reinterpret_cast<uint4*>(O + b * sb + h * sh + (i64)row * ss + 8 * c) =
            make_uint4(0u, 0u, 0u, 0u);
        if (c == 0) LSE[((i64)b * hq + h) * rows + row] = NEG_INF;
    }
}

// Gradient rows no per-sequence backward writes (padding, sequences without queries or keys):
// zero. `side` 0: dQ (query rows), 1: dK / dV (key rows).
extern "C" __global__ void __launch_bounds__(256) seq_zero_rows(
    u16* __restrict__ X, const int* __restrict__ seqtab, int nseq, int packed, int side, int nb,
    int heads, int rows, int dim, i64 sb, i64 sh, i64 ss) {
    const int chunks = dim / 8;
    const i64 total = (i64)nb * heads * rows * chunks;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const int c = (int)(idx % chunks);
        i64 r = idx / chunks;
        const int row = (int)(r % rows);
        r /= rows;
        const int h = (int)(r % heads), b = (int)(r / heads);
        if (seq_row_live(seqtab, nseq, packed, b, row, side)) continue;
        *reinterpret_cast<uint4*>(X + b * sb + h * sh + (i64)row * ss + 8 * c) =
            make_uint4(0u, 0u, 0u, 0u);
    }
}

// One sequence's LSE rows, contiguous [hq, qlen], for its per-sequence backward.
extern "C" __global__ void seq_lse_gather(const float* __restrict__ lse, float* __restrict__ out,
                                          int hq, i64 lse_rows, int b, int q0, int qlen) {
    const i64 total = (i64)hq * qlen;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const int h = (int)(idx / qlen), i = (int)(idx % qlen);
        out[idx] = lse[((i64)b * hq + h) * lse_rows + q0 + i];
    }
}

// Learnable sink gradient, d s_h = -sum_i exp(s_h - LSE_i) D_i with D_i = rowsum(dO_i O_i), over
// the rows that admit a key (finite LSE) and, in padded tensors, lie in their sequence.
// Deterministic: block (h, c) sums rows [c per, (c + 1) per) of the flattened (batch, row)
// range, warp w the rows w, w + 8, ... in order, then the warps in order; sink_grad_final adds
// the chunks in order. No atomics.
#define SINK_CHUNKS 64
extern "C" __global__ void __launch_bounds__(256) sink_grad_partial(
    const u16* __restrict__ O, const u16* __restrict__ dO, const float* __restrict__ lse,
    const float* __restrict__ sink, float* __restrict__ part, const int* __restrict__ seqtab,
    int packed, int nb, int hq, int rows, int dv, i64 sb, i64 sh, i64 ss) {
    __shared__ float wsum[8];
    const int h = blockIdx.x, c = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 total = (i64)nb * rows;
    const i64 per = (total + SINK_CHUNKS - 1) / SINK_CHUNKS;
    const i64 g0 = c * per;
    const i64 g1 = g0 + per < total ? g0 + per : total;
    const float sl = sink[h];
    float acc = 0.f;
    for (i64 g = g0 + warp; g < g1; g += 8) {
        const int b = (int)(g / rows), row = (int)(g % rows);
        if (seqtab != nullptr && !packed) {
            const int* te = seqtab + SEQ_INTS * b;
            if (row < te[1] || row >= te[1] + te[2]) continue;
        }
        const float L = lse[((i64)b * hq + h) * rows + row];
        if (L == NEG_INF) continue;
        const i64 base = b * sb + h * sh + (i64)row * ss;
        const uint4* o4 = reinterpret_cast<const uint4*>(O + base);
        const uint4* d4 = reinterpret_cast<const uint4*>(dO + base);
        float dot = 0.f;
        for (int v = lane; v < (dv >> 3); v += 32) {
            const uint4 x = o4[v], y = d4[v];
            const unsigned xs[4] = {x.x, x.y, x.z, x.w};
            const unsigned ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                dot += lowf((u16)(xs[k] & 0xffff)) * lowf((u16)(ys[k] & 0xffff));
                dot += lowf((u16)(xs[k] >> 16)) * lowf((u16)(ys[k] >> 16));
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        acc += expf(sl - L) * dot;
    }
    if (lane == 0) wsum[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < 8; w++) t += wsum[w];
        part[(i64)h * SINK_CHUNKS + c] = t;
    }
}

extern "C" __global__ void sink_grad_final(const float* __restrict__ part,
                                           float* __restrict__ d_sink, int hq) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hq) return;
    float t = 0.f;
    for (int c = 0; c < SINK_CHUNKS; c++) t += part[(i64)h * SINK_CHUNKS + c];
    d_sink[h] = -t;
}
