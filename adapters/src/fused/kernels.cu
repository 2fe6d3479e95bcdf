// NVRTC kernels of the fused executor (SM90: wgmma). Compiled at run time for `sm_90a` once per
// (dtype, padded head dims); the host prepends:
//   LOWP_BF16   1 for bf16, 0 for fp16
//   DQK         Q/K head dim padded to a multiple of 128 (each warpgroup owns DQK/2 of it)
//   DV          V head dim padded to a multiple of 64 (each warpgroup owns DV/2 output columns)
//   wg_ss_s / wg_rs_o: the wgmma wrappers (generated: their operand lists are 32..128 long)
// and ../nvrtc_prelude.cu (types, conversions, row_range). No CUDA headers: conversions and
// async copies are inline PTX.

#define BM 64                 // query rows per CTA
#define BN 64                 // keys per iteration
#define DQH (DQK / 2)         // qk columns per warpgroup
#define DVH (DV / 2)          // output columns per warpgroup
#define OREGS (DVH / 2)       // fp32 accumulator registers per thread for O (m64 x DVH)

// Shared memory (bytes from a 1024-aligned base). Operand tiles use the 128-byte swizzle wgmma
// descriptors expect: 64-column atoms of 8 rows x 128 B, 16-byte chunk c of row r stored at
// chunk c ^ (r % 8).
#define SQ_OFF 0
#define SK_OFF (SQ_OFF + BM * DQK * 2)
#define SV_OFF (SK_OFF + BN * DQK * 2)
#define SX_OFF (SV_OFF + DV * BN * 2)
#define SBAR_OFF (SX_OFF + 2 * 128 * 32 * 4)  // two mbarriers: K tile full, V tile full
#define SMEM_USED (SBAR_OFF + 64)

// A CUtensorMap (TMA descriptor) as the driver encodes it, passed by value as a kernel parameter.
struct __align__(128) TmapT {
    u64 x[16];
};

// 16-byte async copy; `ok == false` writes zeros and reads nothing.
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool ok) {
    int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Thread-block clusters of two CTAs (adjacent query tiles of one head) share every K and V tile:
// each CTA loads half of it with TMA and multicasts it into both CTAs' shared memory.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}
__device__ __forceinline__ void mbar_init(unsigned a, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned a, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes)
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

// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
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

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
__device__ __forceinline__ u64 sdesc(unsigned saddr) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

// Loads rows [row0, row0 + 64) x columns [0, D) of a row-major operand (row stride rs elements,
// `nrows` valid rows, `ncols` valid columns; the rest zero) into swizzled atoms at s_base.
template <int D>
__device__ __forceinline__ void load_rows(unsigned s_base, const u16* g, i64 rs, int row0,
                                          int nrows, int ncols) {
    constexpr int CH = D / 8;
    for (int idx = threadIdx.x; idx < 64 * CH; idx += 256) {
        const int r = idx / CH, c = idx % CH;
        const int row = row0 + r;
        const bool ok = row < nrows && c * 8 < ncols;
        const u16* src = ok ? g + (i64)row * rs + c * 8 : g;
        const unsigned dst = s_base + (c >> 3) * (64 * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
        cp16(dst, src, ok);
    }
}

// Issued by one thread of each CTA of the pair: its half of key tile j (rows [32 rank, 32 rank +
// 32) of every 64-column atom) multicast to both CTAs; the CTA's own barrier expects the whole
// tile (both halves land in its shared memory). K's map is 4-D (d, then the row, head and batch
// dimensions in the order `pos` gives: slot 1..3 of each).
__device__ __forceinline__ void issue_k(unsigned sK, const TmapT* tmk, int j, int hk, int b,
                                        unsigned rank, unsigned mbar, int pos_row, int pos_head) {
    mbar_expect_tx(mbar, BN * DQK * 2);
    const int row = j * BN + (int)rank * (BN / 2);
    int c[4];
    c[1] = pos_row == 1 ? row : (pos_head == 1 ? hk : b);
    c[2] = pos_row == 2 ? row : (pos_head == 2 ? hk : b);
    c[3] = pos_row == 3 ? row : (pos_head == 3 ? hk : b);
#pragma unroll
    for (int a = 0; a < DQK / 64; a++) {
        tma4_mc(sK + a * (BN * 128) + rank * (BN / 2) * 128, tmk, a * 64, c[1], c[2], c[3], mbar);
    }
}

// Its half of V^T tile j: rows [rank * DVH, (rank + 1) * DVH) x keys [64 j, 64 j + 64).
__device__ __forceinline__ void issue_v(unsigned sV, const TmapT* tmv, int j, int bh,
                                        unsigned rank, unsigned mbar) {
    mbar_expect_tx(mbar, DV * BN * 2);
    tma3_mc(sV + rank * DVH * 128, tmv, j * BN, (int)rank * DVH, bh, mbar);
}

// Forward: one CTA of two warpgroups per (64 query rows, query head, batch), clusters of two CTAs
// (adjacent query tiles of one head) sharing K and V tiles through TMA multicast. Warpgroup g
// computes the partial scores over its half of the qk dim; the halves are exchanged through
// shared memory (both warpgroups then hold the same full scores: a + b == b + a), both run the
// same online softmax, and warpgroup g accumulates output columns [g*DVH, (g+1)*DVH).
// Grid: x = batch * heads_q, y = query tiles rounded up to even (heaviest first for causal
// masks); cluster (1, 2, 1). Both CTAs of a cluster visit the union of their key ranges (the
// per-element mask keeps each row exact).
extern "C" __global__ void __launch_bounds__(256, 1) fused_fwd(
    const __grid_constant__ TmapT tmk, const __grid_constant__ TmapT tmv,
    const u16* __restrict__ Q, u16* __restrict__ O, float* __restrict__ LSE, int sq, int skv,
    int hq, int group, int dqk, int dv, i64 q_sb, i64 q_sh, i64 q_ss, i64 o_sb, i64 o_sh,
    i64 o_ss, i64 off, i64 left, i64 right, float scale_log2, int pos_row, int pos_head) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned sbase = (raw + 1023u) & ~1023u;
    unsigned char* sm = smem_raw + (sbase - raw);
    const unsigned sQ = sbase + SQ_OFF, sK = sbase + SK_OFF, sV = sbase + SV_OFF;
    const unsigned barK = sbase + SBAR_OFF, barV = barK + 8;
    float* X = reinterpret_cast<float*>(sm + SX_OFF);

    const int b = blockIdx.x / hq, h = blockIdx.x % hq, hk = h / group;
    const int hkv = hq / group;
    const int m0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;
    const unsigned rank = cluster_rank();
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = t & 31;
    const u16* q = Q + b * q_sb + h * q_sh;

    // This thread's two rows, their key ranges (empty past the end).
    int rlo[2], rhi[2];
    const int r0 = m0 + 16 * warp + (lane >> 2);
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int row = r0 + 8 * rr;
        i64 lo = 0, hi = 0;
        if (row < sq) row_range(row, off, left, right, skv, &lo, &hi);
        rlo[rr] = (int)lo;
        rhi[rr] = (int)hi;
    }
    // Key tiles the pair's rows admit (ranges are monotone in the row); identical in both CTAs.
    const int pair_lo = (int)(gridDim.y - 2 - (blockIdx.y & ~1u)) * BM;
    const int pair_end = pair_lo + 2 * BM < sq ? pair_lo + 2 * BM : sq;
    i64 lo0, hi0, lo1, hi1;
    row_range(pair_lo, off, left, right, skv, &lo0, &hi0);
    row_range(pair_end - 1, off, left, right, skv, &lo1, &hi1);
    const int jlo = (int)(lo0 / BN);
    const int jhi = hi1 > lo0 ? (int)((hi1 + BN - 1) / BN) : jlo;

    if (tid == 0) {
        mbar_init(barK, 1);
        mbar_init(barV, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // Both CTAs' barriers exist before either multicasts into the other.
    cluster_sync();
    if (tid == 0 && jlo < jhi) {
        issue_k(sK, &tmk, jlo, hk, b, rank, barK, pos_row, pos_head);
        issue_v(sV, &tmv, jlo, b * hkv + hk, rank, barV);
    }

    float o[OREGS];
#pragma unroll
    for (int i = 0; i < OREGS; i++) o[i] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};

    if (jlo < jhi) {
        load_rows<DQK>(sQ, q, q_ss, m0, sq, dqk);
        cp_commit();
        cp_wait0();
        fence_async_smem();
        __syncthreads();
    }
    for (int j = jlo; j < jhi; ++j) {
        const unsigned parity = (unsigned)(j - jlo) & 1u;
        mbar_wait(barK, parity);
        // Partial S = Q[:, half] K[:, half]^T.
        float s[32];
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < DQH / 16; kk++) {
            const int kg = wg * (DQH / 16) + kk;
            const unsigned a = sQ + (kg >> 2) * (BM * 128) + (kg & 3) * 32;
            const unsigned bb = sK + (kg >> 2) * (BN * 128) + (kg & 3) * 32;
            wg_ss_s(s, sdesc(a), sdesc(bb), kk > 0 ? 1 : 0);
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int i = 0; i < 32; i++) fence_reg(s[i]);
        cluster_sync();  // both CTAs are done with their copy of K tile j
        if (tid == 0 && j + 1 < jhi) issue_k(sK, &tmk, j + 1, hk, b, rank, barK, pos_row, pos_head);

        // Exchange the partial scores (thread t of both warpgroups holds the same elements).
        float* xm = X + wg * 4096;
        const float* xo = X + (1 - wg) * 4096;
#pragma unroll
        for (int i = 0; i < 32; i++) xm[i * 128 + t] = s[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] += xo[i * 128 + t];

        // Mask, online softmax (base 2). Element 4i+e: row rr = e >> 1, key n0 + 8i + 2(lane%4) + e%2.
        const int n0 = j * BN;
        float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int i = 0; i < 8; i++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = n0 + 8 * i + 2 * (lane & 3) + (e & 1);
                const int rr = e >> 1;
                const float x = (col >= rlo[rr] && col < rhi[rr]) ? s[4 * i + e] * scale_log2
                                                                   : NEG_INF;
                s[4 * i + e] = x;
                tmax[rr] = fmaxf(tmax[rr], x);
            }
        }
        float alpha[2], mbase[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            tmax[rr] = fmaxf(tmax[rr], __shfl_xor_sync(0xffffffffu, tmax[rr], 1));
            tmax[rr] = fmaxf(tmax[rr], __shfl_xor_sync(0xffffffffu, tmax[rr], 2));
            const float mnew = fmaxf(mrow[rr], tmax[rr]);
            alpha[rr] = mnew == NEG_INF ? 1.f : exp2f(mrow[rr] - mnew);
            mbase[rr] = mnew == NEG_INF ? 0.f : mnew;
            mrow[rr] = mnew;
            lrow[rr] *= alpha[rr];
        }
        unsigned pa[16];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float p0 = exp2f(s[4 * i + 0] - mbase[0]);
            const float p1 = exp2f(s[4 * i + 1] - mbase[0]);
            const float p2 = exp2f(s[4 * i + 2] - mbase[1]);
            const float p3 = exp2f(s[4 * i + 3] - mbase[1]);
            lrow[0] += p0 + p1;
            lrow[1] += p2 + p3;
            // A fragment of k-step i/2: regs {row r0 k lo, row r1 k lo, row r0 k hi, row r1 k hi}.
            pa[(i >> 1) * 4 + (i & 1) * 2 + 0] = pack2(p0, p1);
            pa[(i >> 1) * 4 + (i & 1) * 2 + 1] = pack2(p2, p3);
        }
        if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
            for (int i = 0; i < OREGS / 4; i++) {
                o[4 * i + 0] *= alpha[0];
                o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1];
                o[4 * i + 3] *= alpha[1];
            }
        }

        mbar_wait(barV, parity);
#pragma unroll
        for (int i = 0; i < OREGS; i++) fence_reg(o[i]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const unsigned bb = sV + (wg * DVH) * 128 + kk * 32;
            wg_rs_o(o, pa[4 * kk + 0], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3], sdesc(bb));
        }
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int i = 0; i < OREGS; i++) fence_reg(o[i]);
        cluster_sync();  // both CTAs are done with their copy of V tile j
        if (tid == 0 && j + 1 < jhi) issue_v(sV, &tmv, j + 1, b * hkv + hk, rank, barV);
    }

    // Epilogue: O = acc / l (0 for rows with no admitted key), LSE = ln(sum exp), -inf if empty.
    float inv[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        float l = lrow[rr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        lrow[rr] = l;
        inv[rr] = l > 0.f ? 1.f / l : 0.f;
    }
    u16* ob = O + b * o_sb + h * o_sh;
#pragma unroll
    for (int i = 0; i < OREGS / 4; i++) {
        const int col = wg * DVH + 8 * i + 2 * (lane & 3);
        if (col < dv) {
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int row = r0 + 8 * rr;
                if (row < sq) {
                    *reinterpret_cast<unsigned*>(ob + (i64)row * o_ss + col) =
                        pack2(o[4 * i + 2 * rr] * inv[rr], o[4 * i + 2 * rr + 1] * inv[rr]);
                }
            }
        }
    }
    if (wg == 0 && (lane & 3) == 0) {
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = r0 + 8 * rr;
            if (row < sq) {
                LSE[((i64)b * hq + h) * sq + row] =
                    lrow[rr] > 0.f ? (mrow[rr] + log2f(lrow[rr])) * LN2 : NEG_INF;
            }
        }
    }
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
