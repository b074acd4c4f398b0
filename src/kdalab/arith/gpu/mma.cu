// kdalab's GPU kernels for the H200's matrix arithmetic (kdalab.arith.gpu.mma loads this file and
// compiles it with NVRTC through CuPy). Each kernel computes what one CPU model of
// kdalab.arith.tensorcore computes, bit for bit, batched over a leading dimension.
//
// One warp computes one 16x8 tile of D = A B (+ C0) for one batch element, looping over K in
// blocks of 16 (zero-padded), the accumulator chained from one mma.sync to the next.
// A [batch, M, K], B [batch, K, N], C0/D [batch, M, N], all row-major and contiguous.

__device__ __forceinline__ unsigned short ld16(const unsigned short* p, int r, int c, int R, int C) {
    return (r < R && c < C) ? p[(long long)r * C + c] : (unsigned short)0;
}
__device__ __forceinline__ unsigned pack(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

// The 16x8 tile of D one warp computes, and the lane's place in the m16n8k16 fragments
// (PTX ISA: g = lane / 4 picks rows g and g + 8, t = lane % 4 the column pairs 2t, 2t + 1).
struct WarpTile {
    long long bi;  // batch element
    int r0, c0;    // the tile's first row and column
    int g, t;
};

// One warp per 16x8 tile of the [batch, M, N] output; false for the warps past the last tile.
__device__ __forceinline__ bool warp_tile(int M, int N, long long batch, WarpTile& w) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int tm = (M + 15) / 16, tn = (N + 7) / 8;
    if (warp >= batch * tm * tn) return false;
    w.bi = warp / (tm * tn);
    int rem = (int)(warp % (tm * tn));
    w.r0 = (rem / tn) * 16;
    w.c0 = (rem % tn) * 8;
    w.g = lane >> 2;
    w.t = lane & 3;
    return true;
}

// The lane's A fragment of the k16 block at k0 (fa[0], fa[1]: products k0..k0+7 of rows g and
// g + 8; fa[2], fa[3]: k0+8..k0+15) and its B fragment (fb[0]: k0..k0+7; fb[1]: k0+8..k0+15),
// zero outside the matrices. An m16n8k8 slice uses fa[0], fa[1] and fb[0].
__device__ __forceinline__ void load_fragments(
    const unsigned short* a, const unsigned short* b, const WarpTile& w, int k0, int M, int N,
    int K, unsigned (&fa)[4], unsigned (&fb)[2])
{
    int r = w.r0 + w.g, k = k0 + 2 * w.t, c = w.c0 + w.g;
    fa[0] = pack(ld16(a, r, k, M, K), ld16(a, r, k + 1, M, K));
    fa[1] = pack(ld16(a, r + 8, k, M, K), ld16(a, r + 8, k + 1, M, K));
    fa[2] = pack(ld16(a, r, k + 8, M, K), ld16(a, r, k + 9, M, K));
    fa[3] = pack(ld16(a, r + 8, k + 8, M, K), ld16(a, r + 8, k + 9, M, K));
    fb[0] = pack(ld16(b, k, c, K, N), ld16(b, k + 1, c, K, N));
    fb[1] = pack(ld16(b, k + 8, c, K, N), ld16(b, k + 9, c, K, N));
}

// d = c + a b over one k16 block, fp16 in and out (c and d: two f16x2 registers).
__device__ __forceinline__ void mma_f16(const unsigned (&fa)[4], const unsigned (&fb)[2],
                                        unsigned c0, unsigned c1, unsigned& d0, unsigned& d1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
        : "=r"(d0), "=r"(d1)
        : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]), "r"(c0), "r"(c1));
}

// The warp's fp16 tile (rows g and g + 8, columns 2t and 2t + 1) into D.
__device__ __forceinline__ void store_f16(unsigned short* D, const WarpTile& w, int M, int N,
                                          unsigned acc0, unsigned acc1) {
    unsigned short* d = D + w.bi * (long long)M * N;
    int rr[2] = {w.r0 + w.g, w.r0 + w.g + 8};
    unsigned accs[2] = {acc0, acc1};
    for (int i = 0; i < 2; ++i) {
        int c = w.c0 + 2 * w.t;
        if (rr[i] < M && c < N) d[(long long)rr[i] * N + c] = (unsigned short)(accs[i] & 0xFFFF);
        if (rr[i] < M && c + 1 < N) d[(long long)rr[i] * N + c + 1] = (unsigned short)(accs[i] >> 16);
    }
}

extern "C" __global__ void mma_f16_acc(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    const unsigned short* __restrict__ C0, unsigned short* __restrict__ D,
    int M, int N, int K, long long batch)
{
    WarpTile w;
    if (!warp_tile(M, N, batch, w)) return;
    const unsigned short* a = A + w.bi * (long long)M * K;
    const unsigned short* b = B + w.bi * (long long)K * N;
    unsigned acc0 = 0u, acc1 = 0u;
    if (C0 != nullptr) {
        const unsigned short* c = C0 + w.bi * (long long)M * N;
        int r = w.r0 + w.g, col = w.c0 + 2 * w.t;
        acc0 = pack(ld16(c, r, col, M, N), ld16(c, r, col + 1, M, N));
        acc1 = pack(ld16(c, r + 8, col, M, N), ld16(c, r + 8, col + 1, M, N));
    }
    for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned fa[4], fb[2];
        load_fragments(a, b, w, k0, M, N, K, fa, fb);
        mma_f16(fa, fb, acc0, acc1, acc0, acc1);
    }
    store_f16(D, w, M, N, acc0, acc1);
}

// f32 accumulation; IN_BF16 selects bf16 or f16 operands.
template <bool IN_BF16>
__device__ void mma_f32_acc_impl(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    const float* __restrict__ C0, float* __restrict__ D, int M, int N, int K, long long batch)
{
    WarpTile w;
    if (!warp_tile(M, N, batch, w)) return;
    const unsigned short* a = A + w.bi * (long long)M * K;
    const unsigned short* b = B + w.bi * (long long)K * N;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int ar[4] = {w.r0 + w.g, w.r0 + w.g, w.r0 + w.g + 8, w.r0 + w.g + 8};
    int ac[4] = {w.c0 + 2 * w.t, w.c0 + 2 * w.t + 1, w.c0 + 2 * w.t, w.c0 + 2 * w.t + 1};
    if (C0 != nullptr) {
        const float* c = C0 + w.bi * (long long)M * N;
        for (int i = 0; i < 4; ++i)
            acc[i] = (ar[i] < M && ac[i] < N) ? c[(long long)ar[i] * N + ac[i]] : 0.f;
    }
    for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned fa[4], fb[2];
        load_fragments(a, b, w, k0, M, N, K, fa, fb);
        float d0, d1, d2, d3;
        if (IN_BF16) {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]),
                  "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
        } else {
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                : "r"(fa[0]), "r"(fa[1]), "r"(fa[2]), "r"(fa[3]), "r"(fb[0]), "r"(fb[1]),
                  "f"(acc[0]), "f"(acc[1]), "f"(acc[2]), "f"(acc[3]));
        }
        acc[0] = d0; acc[1] = d1; acc[2] = d2; acc[3] = d3;
    }
    float* d = D + w.bi * (long long)M * N;
    for (int i = 0; i < 4; ++i)
        if (ar[i] < M && ac[i] < N) d[(long long)ar[i] * N + ac[i]] = acc[i];
}

// cublasGemmEx COMPUTE_16F as measured (one matrix per call): K <= 16 is one k16 instruction;
// K > 16 is slices of 8 products, each one instruction with C = 0, added left to right in fp16.
// K8 selects m16n8k8 for the slices, else m16n8k16 with the upper 8 products zero.
template <bool K8>
__device__ void gemmex_f16_impl(
    const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
    unsigned short* __restrict__ D, int M, int N, int K, long long batch)
{
    WarpTile w;
    if (!warp_tile(M, N, batch, w)) return;
    const unsigned short* a = A + w.bi * (long long)M * K;
    const unsigned short* b = B + w.bi * (long long)K * N;
    unsigned acc0 = 0u, acc1 = 0u;
    const unsigned zero = 0u;
    int step = (K <= 16) ? 16 : 8;
    for (int k0 = 0; k0 < K; k0 += step) {
        unsigned fa[4], fb[2];
        load_fragments(a, b, w, k0, M, N, K, fa, fb);  // a slice of 8 reads fa[0..1], fb[0]
        unsigned d0, d1;
        if (step == 16) {
            mma_f16(fa, fb, zero, zero, d0, d1);
        } else if (K8) {
            asm volatile(
                "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3}, {%4}, {%5,%6};\n"
                : "=r"(d0), "=r"(d1)
                : "r"(fa[0]), "r"(fa[1]), "r"(fb[0]), "r"(zero), "r"(zero));
        } else {
            const unsigned lo[4] = {fa[0], fa[1], zero, zero}, lob[2] = {fb[0], zero};
            mma_f16(lo, lob, zero, zero, d0, d1);
        }
        if (k0 == 0) {
            acc0 = d0; acc1 = d1;
        } else {
            asm volatile("add.rn.f16x2 %0, %1, %2;\n" : "=r"(acc0) : "r"(acc0), "r"(d0));
            asm volatile("add.rn.f16x2 %0, %1, %2;\n" : "=r"(acc1) : "r"(acc1), "r"(d1));
        }
    }
    store_f16(D, w, M, N, acc0, acc1);
}

extern "C" __global__ void gemmex_f16_k8(const unsigned short* A, const unsigned short* B,
    unsigned short* D, int M, int N, int K, long long batch) {
    gemmex_f16_impl<true>(A, B, D, M, N, K, batch);
}
extern "C" __global__ void gemmex_f16_k16(const unsigned short* A, const unsigned short* B,
    unsigned short* D, int M, int N, int K, long long batch) {
    gemmex_f16_impl<false>(A, B, D, M, N, K, batch);
}

// cuBLAS fp32 GEMM's order for the seed's L (K = 128) as measured: K in slices of SLICE, each
// an fp32 FMA chain in k order from 0, the slice sums added left to right. One thread an output.
extern "C" __global__ void sgemm_slices(const float* __restrict__ A, const float* __restrict__ B,
    float* __restrict__ D, int M, int N, int K, long long batch, int slice)
{
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * M * N) return;
    long long bi = idx / ((long long)M * N);
    int rem = (int)(idx % ((long long)M * N));
    int r = rem / N, c = rem % N;
    const float* a = A + bi * (long long)M * K + (long long)r * K;
    const float* b = B + bi * (long long)K * N + c;
    float total = 0.f;
    for (int s0 = 0; s0 < K; s0 += slice) {
        float acc = 0.f;
        int e = min(s0 + slice, K);
        // Inline PTX without .ftz: CuPy compiles with -ftz=true, which would flush subnormal
        // operands and results of __fmaf_rn / __fadd_rn (cuBLAS keeps them).
        for (int k = s0; k < e; ++k)
            asm("fma.rn.f32 %0, %1, %2, %0;" : "+f"(acc) : "f"(a[k]), "f"(b[(long long)k * N]));
        if (s0 == 0) total = acc;
        else asm("add.rn.f32 %0, %0, %1;" : "+f"(total) : "f"(acc));
    }
    D[idx] = total;
}

extern "C" __global__ void mma_bf16_f32_acc(const unsigned short* A, const unsigned short* B,
    const float* C0, float* D, int M, int N, int K, long long batch) {
    mma_f32_acc_impl<true>(A, B, C0, D, M, N, K, batch);
}
extern "C" __global__ void mma_f16_f32_acc(const unsigned short* A, const unsigned short* B,
    const float* C0, float* D, int M, int N, int K, long long batch) {
    mma_f32_acc_impl<false>(A, B, C0, D, M, N, K, batch);
}
