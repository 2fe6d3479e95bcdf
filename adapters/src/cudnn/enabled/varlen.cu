// Per-sequence-length support around the cuDNN call (NVRTC; no CUDA headers).
// - varlen_setup writes the graph's per-call tensors into the scratch: SEQ_LEN_Q/KV (int32),
//   the row starts (int32, for the kernels below) and the ragged offsets (elements; int32, or int64 where they may not fit).
// - varlen_lse_out / varlen_lse_in move LSE between cuDNN's dense Stats [b, h, s_max] and the
//   caller's [batch_dim, h, rows] layout (-inf in padding rows; 0 in the dense copy's unused
//   rows, so the backward never computes -inf - -inf).
// - varlen_zero_rows zeroes the padding rows of a 16-bit tensor (cuDNN promises nothing there).
typedef unsigned short u16;
typedef long long i64;

#define VARLEN_CHUNK 128
#define NEG_INF __int_as_float(0xff800000)

struct VarlenChunk {
    int b0;
    int n;
    int len_q[VARLEN_CHUNK];
    int len_kv[VARLEN_CHUNK];
    int start_q[VARLEN_CHUNK];
    int start_kv[VARLEN_CHUNK];
};

// A ragged offset, int64 or (as TransformerEngine when the offsets fit) int32.
__device__ __forceinline__ void put(void* p, int i, i64 v, int wide) {
    if (wide) ((i64*)p)[i] = v; else ((int*)p)[i] = (int)v;
}

// Strides (batch, seq) of Q, K, V, O in elements; packed tensors have batch stride 0.
extern "C" __global__ void varlen_setup(VarlenChunk c, int batch, int packed, int wide,
                                        i64 rows_q, i64 rows_kv, i64 qb, i64 qs, i64 kb, i64 ks,
                                        i64 vb, i64 vs, i64 ob, i64 os, int* seq_q, int* seq_kv,
                                        int* start_q, int* start_kv, void* rq, void* rk,
                                        void* rv, void* ro) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < c.n) {
        const int b = c.b0 + i;
        seq_q[b] = c.len_q[i];
        seq_kv[b] = c.len_kv[i];
        start_q[b] = c.start_q[i];
        start_kv[b] = c.start_kv[i];
        if (rq) {
            const i64 bd = packed ? 0 : b;
            put(rq, b, bd * qb + (i64)c.start_q[i] * qs, wide);
            put(rk, b, bd * kb + (i64)c.start_kv[i] * ks, wide);
            put(rv, b, bd * vb + (i64)c.start_kv[i] * vs, wide);
            put(ro, b, bd * ob + (i64)c.start_q[i] * os, wide);
        }
    }
    // the closing entry: the end of the last sequence (packed) or of the batch (padded)
    if (i == 0 && rq && c.b0 + c.n == batch) {
        put(rq, batch, packed ? rows_q * qs : (i64)batch * qb, wide);
        put(rk, batch, packed ? rows_kv * ks : (i64)batch * kb, wide);
        put(rv, batch, packed ? rows_kv * vs : (i64)batch * vb, wide);
        put(ro, batch, packed ? rows_q * os : (i64)batch * ob, wide);
    }
}

// The sequence owning physical row `pr` of tensor batch `bd`.
__device__ __forceinline__ int owner(const int* start, int batch, int bd, i64 pr, int packed) {
    if (!packed) return bd;
    int lo = 0, hi = batch - 1;  // largest b with start[b] <= pr
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (start[mid] <= pr) lo = mid; else hi = mid - 1;
    }
    return lo;
}

extern "C" __global__ void varlen_lse_out(const float* __restrict__ dense, float* __restrict__ lse,
                                          const int* __restrict__ len,
                                          const int* __restrict__ start, int batch, int heads,
                                          int s_max, int bdim, i64 rows, int packed) {
    const i64 total = (i64)bdim * heads * rows;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const i64 pr = idx % rows, t = idx / rows;
        const int h = (int)(t % heads), bd = (int)(t / heads);
        const int b = owner(start, batch, bd, pr, packed);
        const i64 r = pr - start[b];
        lse[idx] = (r >= 0 && r < len[b]) ? dense[((i64)b * heads + h) * s_max + r] : NEG_INF;
    }
}

extern "C" __global__ void varlen_lse_in(const float* __restrict__ lse, float* __restrict__ dense,
                                         const int* __restrict__ len,
                                         const int* __restrict__ start, int batch, int heads,
                                         int s_max, i64 rows, int packed) {
    const i64 total = (i64)batch * heads * s_max;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const i64 r = idx % s_max, t = idx / s_max;
        const int h = (int)(t % heads), b = (int)(t / heads);
        const i64 bd = packed ? 0 : b;
        dense[idx] = r < len[b] ? lse[(bd * heads + h) * rows + start[b] + r] : 0.0f;
    }
}

// Padded batches only (tensor batch = sequence): zero every row outside [start, start + len).
extern "C" __global__ void varlen_zero_rows(u16* __restrict__ x, const int* __restrict__ len,
                                            const int* __restrict__ start, int bdim, int heads,
                                            i64 rows, int cols, i64 sb, i64 sh, i64 ss) {
    const i64 total = (i64)bdim * heads * rows * cols;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const i64 c = idx % cols;
        i64 t = idx / cols;
        const i64 pr = t % rows;
        t /= rows;
        const int h = (int)(t % heads), bd = (int)(t / heads);
        const i64 r = pr - start[bd];
        if (r < 0 || r >= len[bd]) x[bd * sb + h * sh + pr * ss + c] = 0;
    }
}
