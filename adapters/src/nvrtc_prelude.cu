// Shared prelude of the NVRTC sources (chunked, fused), prepended by the host after its defines
// (LOWP_BF16: 1 for bf16, 0 for fp16). No CUDA headers: conversions are inline PTX.
typedef unsigned short u16;
typedef long long i64;
typedef unsigned long long u64;

#define NEG_INF __int_as_float(0xff800000)
#define LN2 0.6931471805599453f

__device__ __forceinline__ u16 f_to_low(float f) {
    u16 r;
#if LOWP_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
#endif
    return r;
}

__device__ __forceinline__ unsigned pack2(float a, float b) {
    return (unsigned)f_to_low(a) | ((unsigned)f_to_low(b) << 16);
}

// Key range [lo, hi) of query row i (same definition as EffectiveMask::row_range).
__device__ __forceinline__ void row_range(i64 i, i64 off, i64 left, i64 right, i64 skv,
                                          i64* lo, i64* hi) {
    i64 c = i + off;
    i64 l = left < 0 ? 0 : (c - left > 0 ? c - left : 0);
    i64 h = right < 0 ? skv : (c + right + 1 < skv ? c + right + 1 : skv);
    *lo = l < skv ? l : skv;
    *hi = h > 0 ? h : 0;
}

