// The fused backward's score kernel (appended after kernels.cu, whose helpers it uses; the host
// adds BSMEM_BYTES, the shared memory the launch allocates, and the wg_ss_b wrapper).
//
// For one chunk of query rows of the chunked backward plan it computes, per 128 x 128 tile of
// (query rows, keys) and query head of the group,
//   S = Q K^T and dP = dO V^T (wgmma, fp32 accumulators, K and V tiles shared by a cluster pair),
//   P = exp(scale S - lse), dS = P (dP - D)  (zero outside the mask),
// and writes P and dS (bf16/fp16) to the plan's buffers. It replaces the two fp32 score GEMMs and
// the elementwise pass of the chunked backward: the scores never travel through device memory in
// fp32, and the three GEMMs that follow (dQ = scale dS K, dV += P^T dO, dK += scale dS^T Q) stay
// cuBLAS calls that accumulate in a fixed order (deterministic).
//
// Persistent: clusters of two CTAs (adjacent query tiles, same key tile, same head) walk the
// tiles ("units") round-robin, query pairs fastest and key tiles slowest (unit_of). Three
// warpgroups per CTA: warpgroup 0 is the producer (one thread issues TMA loads), warpgroups 1
// and 2 each own 64 of the 128 query rows. Head-dim stages of 64 columns stream through a ring
// of BSTAGES slots, first Q/K stages (S), then dO/V stages (dP), unit after unit, so the next
// unit's operands load during this one's epilogue. Each CTA of the pair loads half of every K/V
// tile and multicasts it to both (half the L2 traffic of the B operands). The epilogue leaves P
// and dS in a staging buffer; their global stores are spread over the first stages of the next
// unit, so they overlap its wgmma.
//   bfull[s]  slot s landed (TMA bytes)     bempty[s] cl: both CTAs' eight consumer warps are done

#ifndef LOG2E
#define LOG2E 1.4426950408889634f
#endif
#define BTM 128  // query rows per CTA
#define BTN 128  // keys per CTA
#define BSTAGES 5
#define BSTAGE (BTM * 128 + BTN * 128)  // one 64-column atom of the A and of the B tile
#define BNQ (DQK / 64)                  // stages of S
#define BNST (DQK / 64 + DV / 64)       // stages of S, then of dP
#define BSTG_OFF (BSTAGES * BSTAGE)     // staging: P, then dS (128 rows x 256 B each)
#define BBAR_OFF (BSTG_OFF + 2 * BTM * BTN * 2)
#define BSMEM_USED (BBAR_OFF + 2 * BSTAGES * 8)
static_assert(BSMEM_USED + 1024 <= BSMEM_BYTES, "fused::backward_shared_bytes is smaller than the kernel's layout");
// The stores of a unit's 64 rows x 16 chunks per warpgroup take 8 rounds of 128 threads, one
// round after each of the next unit's first 8 stages.
#define BSTORE_ROUNDS 8
static_assert(BNST >= BSTORE_ROUNDS, "fewer stages than store rounds");

__device__ __forceinline__ void tma4_local(unsigned dst, const TmapT* map, int c0, int c1, int c2,
                                           int c3, unsigned mbar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(mbar)
        : "memory");
}
__device__ __forceinline__ void wg_wait1() {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

// Coordinates 1..3 of a 4-D row map (d, then row, head and batch in stride order): `pos` holds
// the slot of the row in bits 0..1 and of the head in bits 2..3; the batch takes the third.
__device__ __forceinline__ void row_coords(int pos, int row, int head, int batch, int c[4]) {
    const int pr = pos & 3, ph = (pos >> 2) & 3;
#pragma unroll
    for (int s = 1; s < 4; s++) c[s] = pr == s ? row : (ph == s ? head : batch);
}

// Round `j` of a warpgroup's stores of one staged unit: 16-byte chunks `j * 128 + t` of its 64
// rows x 16 chunks, P and dS, where the row is in the chunk and the column below lds (the pad
// past n is written too: zeros, as the mask makes them).
__device__ __forceinline__ void store_round(int j, int t, int c, const unsigned char* stage_p,
                                            const unsigned char* stage_ds, u16* P, u16* dS,
                                            int qt, int kt, int r, int rows, int lds) {
    const int idx = j * 128 + t;
    const int tr = c * 64 + (idx >> 4), ch = idx & 15;
    const int rl = qt * BTM + tr, col = kt * BTN + 8 * ch;
    if (rl < rows && col < lds) {
        const unsigned o = tr * 256 + ((ch ^ (tr & 7)) << 4);
        const i64 at = ((i64)r * rows + rl) * lds + col;
        *reinterpret_cast<uint4*>(P + at) = *reinterpret_cast<const uint4*>(stage_p + o);
        *reinterpret_cast<uint4*>(dS + at) = *reinterpret_cast<const uint4*>(stage_ds + o);
    }
}

// Unit u of the walk: the query-tile pair fastest, then the head of the group, then the key
// tile. The clusters running at once then share a few K/V tiles, each read from DRAM about once
// while L2 holds it, and reuse the chunk's Q/dO tiles (a few MiB) at every key tile. Key tile
// fastest read every K/V tile once per query pair, mostly from DRAM once K and V outgrow L2
// (s=32k: 64 MiB per group), and the consumers waited for the late dP stages.
struct BUnit {
    int kt, qp, r;
};
__device__ __forceinline__ BUnit unit_of(int u, int ktiles, int qpairs, int units) {
    const int heads = units / (ktiles * qpairs);
    BUnit x;
    x.qp = u % qpairs;
    x.r = (u / qpairs) % heads;
    x.kt = u / (qpairs * heads);
    return x;
}
// Does any row of the pair admit any key of the tile? (Ranges are monotone in the row, so
// [first row's lo, last row's hi) holds every admitted key.) Identical in both CTAs.
__device__ __forceinline__ bool unit_active(int qp, int key0, int rows, int i0, i64 off, i64 left,
                                            i64 right, i64 skv) {
    const int first = qp * 2 * BTM;
    const int end = first + 2 * BTM < rows ? first + 2 * BTM : rows;
    i64 lo0, hi0, lo1, hi1;
    row_range((i64)i0 + first, off, left, right, skv, &lo0, &hi0);
    row_range((i64)i0 + end - 1, off, left, right, skv, &lo1, &hi1);
    return hi1 > lo0 && key0 < hi1 && key0 + BTN > lo0;
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) bwd_scores(
    const __grid_constant__ TmapT tmq, const __grid_constant__ TmapT tmk,
    const __grid_constant__ TmapT tmdo, const __grid_constant__ TmapT tmv,
    u16* __restrict__ P, u16* __restrict__ dS, int lds, int rows, int b, int h0, int hk,
    int i0, int klo, int ktiles, int qpairs, int units, const float* __restrict__ lse,
    const float* __restrict__ Dv, i64 head_stride, i64 off, i64 left, i64 right, i64 skv,
    float scale_log2, int posq, int posk, int poso, int posv, float cap_in, float cap_out,
    // P and dS as TMA maps (key, chunk row, head; 64 x 64 boxes): the host passes them for
    // variants that store the staged tiles with TMA (adapters/bench/variants/bwd-tma-stores.patch);
    // this kernel's threads store them through P and dS.
    const __grid_constant__ TmapT tmp, const __grid_constant__ TmapT tmds) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    const unsigned sbase = (raw + 1023u) & ~1023u;
    unsigned char* sm = smem_raw + (sbase - raw);
    const unsigned bars = sbase + BBAR_OFF;
#define BFULL(s) (bars + 8 * (s))
#define BEMPTY(s) (bars + 8 * BSTAGES + 8 * (s))

    const unsigned rank = cluster_rank();
    const int cluster = blockIdx.y >> 1, nclusters = gridDim.y >> 1;
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127, warp = t >> 5, lane = t & 31;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < BSTAGES; s++) {
            mbar_init(BFULL(s), 1);
            mbar_init(BEMPTY(s), 16);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();

    if (wg == 0) {
        // ---- Producer: per active unit, Q/K stages, then dO/V stages ----
        // It needs few registers; the consumers take them (128 x 40 + 256 x 232 <= 65536).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (t == 0) {
            int slot = 0, n = 0;  // ring position, and stages issued so far
            for (int u = cluster; u < units; u += nclusters) {
                const BUnit x = unit_of(u, ktiles, qpairs, units);
                const int key0 = klo + x.kt * BTN;
                if (!unit_active(x.qp, key0, rows, i0, off, left, right, skv)) continue;
                const int qrow = i0 + (2 * x.qp + (int)rank) * BTM;
                const int krow = key0 + (int)rank * (BTN / 2), h = h0 + x.r;
                int cq[4], ck[4], co[4], cv[4];
                row_coords(posq, qrow, h, b, cq);
                row_coords(posk, krow, hk, b, ck);
                row_coords(poso, qrow, h, b, co);
                row_coords(posv, krow, hk, b, cv);
                for (int st = 0; st < BNST; st++, n++) {
                    if (n >= BSTAGES) mbar_wait(BEMPTY(slot), (unsigned)(n / BSTAGES - 1) & 1u);
                    mbar_expect_tx(BFULL(slot), BSTAGE);
                    const unsigned a_dst = sbase + slot * BSTAGE;
                    const unsigned b_dst = a_dst + BTM * 128 + rank * (BTN / 2) * 128;
                    if (st < BNQ) {
                        tma4_local(a_dst, &tmq, st * 64, cq[1], cq[2], cq[3], BFULL(slot));
                        tma4_mc(b_dst, &tmk, st * 64, ck[1], ck[2], ck[3], BFULL(slot));
                    } else {
                        const int d = (st - BNQ) * 64;
                        tma4_local(a_dst, &tmdo, d, co[1], co[2], co[3], BFULL(slot));
                        tma4_mc(b_dst, &tmv, d, cv[1], cv[2], cv[3], BFULL(slot));
                    }
                    slot = slot + 1 == BSTAGES ? 0 : slot + 1;
                }
            }
        }
    } else {
        // ---- Consumer warpgroup c: rows [64 c, 64 c + 64) of each unit's tile ----
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int c = wg - 1;
        const int lrow0 = 16 * warp + (lane >> 2);  // local row of accumulator rows 0; +8 for 1
        const unsigned bar_wg = 2 + c;              // named barrier of this warpgroup
        const unsigned char* stage_p = sm + BSTG_OFF;
        const unsigned char* stage_ds = sm + BSTG_OFF + BTM * BTN * 2;
        const unsigned d0 = sdesc_lo(sbase);
        int slot = 0, n = 0;
        // The staged unit whose stores are pending (qt < 0: none).
        int pend_qt = -1, pend_kt = 0, pend_r = 0;
        for (int u = cluster; u < units; u += nclusters) {
            const BUnit x = unit_of(u, ktiles, qpairs, units);
            const int qt = 2 * x.qp + (int)rank;
            const int key0 = klo + x.kt * BTN;
            if (!unit_active(x.qp, key0, rows, i0, off, left, right, skv)) {
                // Nothing admitted: zeros, straight to memory.
                for (int idx = t; idx < 64 * 16; idx += 128) {
                    const int tr = c * 64 + (idx >> 4), ch = idx & 15;
                    const int rl = qt * BTM + tr, col = x.kt * BTN + 8 * ch;
                    if (rl < rows && col < lds) {
                        const i64 at = ((i64)x.r * rows + rl) * lds + col;
                        *reinterpret_cast<uint4*>(P + at) = make_uint4(0u, 0u, 0u, 0u);
                        *reinterpret_cast<uint4*>(dS + at) = make_uint4(0u, 0u, 0u, 0u);
                    }
                }
                continue;
            }
            // This thread's chunk-local rows, their key ranges (empty past the chunk), lse, D.
            int rlo[2], rhi[2];
            float l2[2], dvec[2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int rl = qt * BTM + c * 64 + lrow0 + 8 * rr;
                i64 lo = 0, hi = 0;
                l2[rr] = 0.f;
                dvec[rr] = 0.f;
                if (rl < rows) {
                    row_range((i64)i0 + rl, off, left, right, skv, &lo, &hi);
                    l2[rr] = lse[(i64)x.r * head_stride + rl] * LOG2E;
                    dvec[rr] = Dv[(i64)x.r * head_stride + rl];
                }
                rlo[rr] = (int)lo;
                rhi[rr] = (int)hi;
            }
            float s[64], dp[64];
#pragma unroll
            for (int i = 0; i < 64; i++) {
                s[i] = 0.f;
                dp[i] = 0.f;
            }
            // The stage loop is unrolled (at most 16 stages): the accumulator each stage adds
            // to is compile-time, so no wgmma sits on a divergent path (ptxas would serialize).
            int prev = 0;
#pragma unroll
            for (int st = 0; st < BNST; st++) {
                mbar_wait(BFULL(slot), (unsigned)(n / BSTAGES) & 1u);
                __syncwarp();
                const unsigned a_off = slot * BSTAGE + c * 64 * 128;
                const unsigned b_off = slot * BSTAGE + BTM * 128;
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const u64 da = sdesc_at(d0, a_off + kk * 32), db = sdesc_at(d0, b_off + kk * 32);
                    if (st < BNQ) {
                        wg_ss_b(s, da, db, (st > 0 || kk > 0) ? 1 : 0);
                    } else {
                        wg_ss_b(dp, da, db, (st > BNQ || kk > 0) ? 1 : 0);
                    }
                }
                wg_commit();
                // While it runs: a round of the previous unit's stores.
                if (st < BSTORE_ROUNDS && pend_qt >= 0) {
                    store_round(st, t, c, stage_p, stage_ds, P, dS, pend_qt, pend_kt, pend_r, rows,
                                lds);
                }
                if (st > 0) {
                    // The previous stage is complete once at most this one is in flight.
                    wg_wait1();
                    __syncwarp();
                    if (lane == 0) {
                        mbar_arrive_cluster(BEMPTY(prev), 0);
                        mbar_arrive_cluster(BEMPTY(prev), 1);
                    }
                }
                if (st == BNQ) {
                    // S is complete (the first dP stage runs meanwhile): P = 2^(S scale log2e -
                    // lse log2e) on admitted keys, 0 elsewhere. Element i: row rr = (i >> 1) & 1,
                    // key key0 + 8 (i >> 2) + 2 (lane % 4) + i % 2.
#pragma unroll
                    for (int i = 0; i < 64; i++) fence_reg(s[i]);
#pragma unroll
                    for (int i = 0; i < 64; i++) {
                        const int col = key0 + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
                        const int rr = (i >> 1) & 1;
#if SOFTCAP
                        // Capped score c tanh(scale s / c), in log2 units (cap_out = c log2 e).
                        s[i] = (col >= rlo[rr] && col < rhi[rr])
                                   ? exp2_approx(fmaf(cap_out, tanhf(s[i] * cap_in), -l2[rr]))
                                   : 0.f;
#else
                        s[i] = (col >= rlo[rr] && col < rhi[rr])
                                   ? exp2_approx(fmaf(s[i], scale_log2, -l2[rr]))
                                   : 0.f;
#endif
                    }
                }
                prev = slot;
                slot = slot + 1 == BSTAGES ? 0 : slot + 1;
                n++;
            }
            wg_wait0();
#pragma unroll
            for (int i = 0; i < 64; i++) fence_reg(dp[i]);
            __syncwarp();
            if (lane == 0) {
                mbar_arrive_cluster(BEMPTY(prev), 0);
                mbar_arrive_cluster(BEMPTY(prev), 1);
            }
#if SOFTCAP
            // dS = P (dP - D) (1 - t^2) with t = tanh(scale s / c), recovered from P itself
            // (t c log2 e = log2 P + lse log2 e) rather than kept in 64 more registers; P = 0
            // (outside the mask, or underflowed) gives dS = 0.
            const float inv_cap_out = 1.f / cap_out;
#pragma unroll
            for (int i = 0; i < 64; i++) {
                const float pv = s[i];
                float g = 0.f;
                if (pv > 0.f) {
                    float lg;
                    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(pv));
                    const float tt = (lg + l2[(i >> 1) & 1]) * inv_cap_out;
                    g = fmaf(-tt, tt, 1.f);
                }
                dp[i] = pv * (dp[i] - dvec[(i >> 1) & 1]) * g;
            }
#else
            // dS = P (dP - D); P is already 0 outside the mask.
#pragma unroll
            for (int i = 0; i < 64; i++) dp[i] = s[i] * (dp[i] - dvec[(i >> 1) & 1]);
#endif
            // Every thread of the warpgroup is done reading the staging buffer (the previous
            // unit's stores); stage this unit's rows: 256-byte rows, 16-byte chunk j of row r at
            // chunk j ^ (r % 8) (conflict-free for the fragment writes and the row reads).
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar_wg) : "memory");
            unsigned char* wp = sm + BSTG_OFF;
#pragma unroll
            for (int j = 0; j < 16; j++) {
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int tr = c * 64 + lrow0 + 8 * rr;
                    const unsigned o = tr * 256 + ((j ^ (tr & 7)) << 4) + 4 * (lane & 3);
                    *reinterpret_cast<unsigned*>(wp + o) =
                        pack2x(s[4 * j + 2 * rr], s[4 * j + 2 * rr + 1]);
                    *reinterpret_cast<unsigned*>(wp + BTM * BTN * 2 + o) =
                        pack2x(dp[4 * j + 2 * rr], dp[4 * j + 2 * rr + 1]);
                }
            }
            asm volatile("bar.sync %0, 128;\n" ::"r"(bar_wg) : "memory");
            pend_qt = qt;
            pend_kt = x.kt;
            pend_r = x.r;
        }
        // The last staged unit's stores.
        if (pend_qt >= 0) {
#pragma unroll
            for (int j = 0; j < BSTORE_ROUNDS; j++) {
                store_round(j, t, c, stage_p, stage_ds, P, dS, pend_qt, pend_kt, pend_r, rows, lds);
            }
        }
    }
    // Neither CTA leaves while the other may still arrive on its barriers or multicast into it.
    cluster_sync();
#undef BFULL
#undef BEMPTY
}
