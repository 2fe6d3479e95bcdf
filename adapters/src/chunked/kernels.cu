// NVRTC kernels of the chunked executor. Compiled at run time once per dtype with
// LOWP_BF16 defined to 1 (bf16) or 0 (fp16), after ../nvrtc_prelude.cu (types, conversions,
// row_range). No CUDA headers: conversions are inline PTX.
#define LOG2E 1.4426950408889634f

__device__ __forceinline__ float low_to_f(u16 x) {
#if LOWP_BF16
    return __uint_as_float(((unsigned)x) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#endif
}

// Local column range [a, b) of the row inside the chunk's key window [kv_lo, kv_lo + n).
__device__ __forceinline__ void local_range(i64 i, i64 kv_lo, int n, i64 off, i64 left,
                                            i64 right, i64 skv, int* a, int* b) {
    i64 lo, hi;
    row_range(i, off, left, right, skv, &lo, &hi);
    i64 la = lo - kv_lo;
    i64 lb = hi - kv_lo;
    la = la > 0 ? la : 0;
    lb = lb < n ? lb : n;
    *a = (int)la;
    *b = (int)(lb > la ? lb : la);
}

// Merge two online-softmax states (max m, sum l), base 2.
__device__ __forceinline__ void merge(float& m, float& l, float om, float ol) {
    float nm = fmaxf(m, om);
    if (nm == NEG_INF) {
        l = 0.f;
    } else {
        l = l * exp2f(m - nm) + ol * exp2f(om - nm);
    }
    m = nm;
}

// A raw score x = q.k in log2 units: x * scale * log2(e), or soft-capped
// c * tanh(scale * x / c) * log2(e) when cap_in = scale / c > 0 (cap_out = c * log2(e)).
__device__ __forceinline__ float score_log2(float x, float scale_log2, float cap_in,
                                            float cap_out) {
    return cap_in > 0.f ? cap_out * tanhf(x * cap_in) : x * scale_log2;
}

// One block (256 threads) per score row. S rows of lds floats (lds % 8 == 0, 32-byte aligned).
// Writes P (all lds columns; zero outside the admitted range) and LSE (natural log, fp32).
// Sink (sink_mode 1: logit 0, 2: logit sink[r] of block head r): exp(s - max) joins the
// denominator of every row with an admitted key (LSE includes it); empty rows stay P = 0,
// LSE = -inf.
extern "C" __global__ void __launch_bounds__(256) softmax_fwd(
    const float* __restrict__ S, u16* __restrict__ P, int lds, int rows, int n, i64 i0,
    i64 kv_lo, float* __restrict__ lse, i64 lse_head_stride, i64 off, i64 left, i64 right,
    i64 skv, float scale_log2, float cap_in, float cap_out, int sink_mode,
    const float* __restrict__ sink) {
    const int row = blockIdx.x;
    const int r = blockIdx.y;
    const size_t base = ((size_t)r * rows + row) * (size_t)lds;
    const float4* s4 = reinterpret_cast<const float4*>(S + base);
    uint2* p2 = reinterpret_cast<uint2*>(P + base);
    int a, b;
    local_range(i0 + row, kv_lo, n, off, left, right, skv, &a, &b);
    // Empty rows get an empty group range (no group then holds an admitted column).
    const int g0 = a >> 2, g1 = a < b ? (b + 3) >> 2 : g0;

    float m = NEG_INF, l = 0.f;
    for (int g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
        float4 v = s4[g];
        float x[4] = {v.x, v.y, v.z, v.w};
        float lm = NEG_INF;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int c = 4 * g + t;
            // Select, never multiply: columns past n are uninitialised.
            x[t] = (c >= a && c < b) ? score_log2(x[t], scale_log2, cap_in, cap_out) : NEG_INF;
            lm = fmaxf(lm, x[t]);
        }
        // Every group in [g0, g1) holds at least one admitted column, so lm is finite.
        float nm = fmaxf(m, lm);
        float add = exp2f(x[0] - nm) + exp2f(x[1] - nm) + exp2f(x[2] - nm) + exp2f(x[3] - nm);
        l = l * exp2f(m - nm) + add;
        m = nm;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float om = __shfl_xor_sync(0xffffffffu, m, o);
        float ol = __shfl_xor_sync(0xffffffffu, l, o);
        merge(m, l, om, ol);
    }
    __shared__ float sm[32], sl[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        m = lane < nw ? sm[lane] : NEG_INF;
        l = lane < nw ? sl[lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float om = __shfl_xor_sync(0xffffffffu, m, o);
            float ol = __shfl_xor_sync(0xffffffffu, l, o);
            merge(m, l, om, ol);
        }
        if (lane == 0) {
            sm[0] = m;
            sl[0] = l;
        }
    }
    __syncthreads();
    float M = sm[0];
    float L = sl[0];
    if (sink_mode != 0 && a < b) {
        // The sink's term, base 2: M stays finite (the row has an admitted key).
        merge(M, L, (sink_mode == 2 ? sink[r] : 0.f) * LOG2E, 1.f);
    }
    const float inv = a < b ? 1.f / L : 0.f;
    for (int g = threadIdx.x; g < (lds >> 2); g += blockDim.x) {
        float y[4] = {0.f, 0.f, 0.f, 0.f};
        if (g >= g0 && g < g1) {
            float4 v = s4[g];
            float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                int c = 4 * g + t;
                y[t] = (c >= a && c < b)
                           ? exp2f(score_log2(x[t], scale_log2, cap_in, cap_out) - M) * inv
                           : 0.f;
            }
        }
        p2[g] = make_uint2(pack2(y[0], y[1]), pack2(y[2], y[3]));
    }
    if (threadIdx.x == 0) {
        lse[(i64)r * lse_head_stride + row] = a < b ? (M + log2f(L)) * LN2 : NEG_INF;
    }
}

// Backward elementwise, one block per score row: P = exp(scale S - lse), dS = P (dP - D).
// Soft-capped (cap_in > 0): P = exp(c t - lse) and dS = P (dP - D) (1 - t^2) with
// t = tanh(scale S / c): the gradient with respect to scale S (the GEMMs apply scale).
extern "C" __global__ void __launch_bounds__(256) bwd_elementwise(
    const float* __restrict__ S, const float* __restrict__ dP, u16* __restrict__ P,
    u16* __restrict__ dS, int lds, int rows, int n, i64 i0, i64 kv_lo,
    const float* __restrict__ lse, const float* __restrict__ Dv, i64 head_stride, i64 off,
    i64 left, i64 right, i64 skv, float scale_log2, float cap_in, float cap_out) {
    const int row = blockIdx.x;
    const int r = blockIdx.y;
    const size_t base = ((size_t)r * rows + row) * (size_t)lds;
    const float4* s4 = reinterpret_cast<const float4*>(S + base);
    const float4* dp4 = reinterpret_cast<const float4*>(dP + base);
    uint2* p2 = reinterpret_cast<uint2*>(P + base);
    uint2* ds2 = reinterpret_cast<uint2*>(dS + base);
    int a, b;
    local_range(i0 + row, kv_lo, n, off, left, right, skv, &a, &b);
    // Empty rows get an empty group range (no group then holds an admitted column).
    const int g0 = a >> 2, g1 = a < b ? (b + 3) >> 2 : g0;
    const float l2 = lse[(i64)r * head_stride + row] * LOG2E;
    const float d = Dv[(i64)r * head_stride + row];
    for (int g = threadIdx.x; g < (lds >> 2); g += blockDim.x) {
        float p[4] = {0.f, 0.f, 0.f, 0.f};
        float ds[4] = {0.f, 0.f, 0.f, 0.f};
        if (g >= g0 && g < g1) {
            float4 v = s4[g];
            float4 w = dp4[g];
            float x[4] = {v.x, v.y, v.z, v.w};
            float y[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                int c = 4 * g + t;
                if (c >= a && c < b) {
                    if (cap_in > 0.f) {
                        const float th = tanhf(x[t] * cap_in);
                        p[t] = exp2f(cap_out * th - l2);
                        ds[t] = p[t] * (y[t] - d) * ((1.f - th) * (1.f + th));
                    } else {
                        p[t] = exp2f(x[t] * scale_log2 - l2);
                        ds[t] = p[t] * (y[t] - d);
                    }
                }
            }
        }
        p2[g] = make_uint2(pack2(p[0], p[1]), pack2(p[2], p[3]));
        ds2[g] = make_uint2(pack2(ds[0], ds[1]), pack2(ds[2], ds[3]));
    }
}

// d_sink[h] = -sum over (b, i) of exp(sink[h] - lse) * D, rows with a finite LSE and a
// non-zero D only (fully masked rows have LSE = -inf, padding rows D = 0). One block per head,
// each thread a fixed stride of rows, then a fixed tree: bitwise reproducible, no atomics.
// Overwrites d_sink[h].
extern "C" __global__ void __launch_bounds__(256) sink_grad(
    const float* __restrict__ lse, const float* __restrict__ Dv, const float* __restrict__ sink,
    float* __restrict__ d_sink, int batch, int heads, i64 rows) {
    const int h = blockIdx.x;
    const float s = sink[h];
    float acc = 0.f;
    for (int bb = 0; bb < batch; bb++) {
        const i64 base = ((i64)bb * heads + h) * rows;
        for (i64 i = threadIdx.x; i < rows; i += blockDim.x) {
            const float l = lse[base + i];
            const float d = Dv[base + i];
            if (l != NEG_INF && d != 0.f) acc += expf(s - l) * d;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ float part[32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) d_sink[h] = -acc;
    }
}

// D[b, h, s] = sum_d dO * O, one warp per row, 16-byte loads (dim % 8 == 0, aligned rows).
extern "C" __global__ void row_dot(const u16* __restrict__ O, const u16* __restrict__ dO,
                                   float* __restrict__ out, int batch, int heads, int seqlen,
                                   int dim, i64 sb, i64 sh, i64 ss) {
    const i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const i64 total = (i64)batch * heads * seqlen;
    if (w >= total) return;
    const int s = (int)(w % seqlen);
    const i64 t = w / seqlen;
    const int h = (int)(t % heads);
    const int bb = (int)(t / heads);
    const i64 base = bb * sb + h * sh + s * ss;
    const uint4* o4 = reinterpret_cast<const uint4*>(O + base);
    const uint4* d4 = reinterpret_cast<const uint4*>(dO + base);
    float acc = 0.f;
    for (int v = lane; v < (dim >> 3); v += 32) {
        uint4 x = o4[v], y = d4[v];
        unsigned xs[4] = {x.x, x.y, x.z, x.w};
        unsigned ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            acc += low_to_f((u16)(xs[k] & 0xffff)) * low_to_f((u16)(ys[k] & 0xffff));
            acc += low_to_f((u16)(xs[k] >> 16)) * low_to_f((u16)(ys[k] >> 16));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[w] = acc;
}

// Contiguous fp32 [rows, cols] -> dtype rows with stride dst_ld.
extern "C" __global__ void cast_rows(const float* __restrict__ src, u16* __restrict__ dst,
                                     i64 dst_ld, int rows, int cols) {
    const i64 total = (i64)rows * cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / cols, c = i % cols;
        dst[r * dst_ld + c] = f_to_low(src[i]);
    }
}

extern "C" __global__ void zero_rows(u16* __restrict__ dst, i64 row_stride, i64 head_stride,
                                     int rows, int heads, int cols) {
    const i64 total = (i64)heads * rows * cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 c = i % cols, t = i / cols;
        const i64 r = t % rows, h = t / rows;
        dst[h * head_stride + r * row_stride + c] = 0;
    }
}

extern "C" __global__ void fill_f32(float* __restrict__ dst, i64 ld, int rows, i64 cols,
                                    float value) {
    const i64 total = (i64)rows * cols;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (i64)gridDim.x * blockDim.x) {
        dst[(i / cols) * ld + i % cols] = value;
    }
}

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Standard-normal random fill (counter-based: element i depends only on seed and i).
extern "C" __global__ void fill_normal(u16* __restrict__ dst, i64 n, u64 seed) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {
        u64 h = mix64(seed * 0x9E3779B97F4A7C15ull + (u64)i);
        float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
        float u2 = (float)((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        float z = sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
        dst[i] = f_to_low(z);
    }
}
