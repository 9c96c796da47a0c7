// Times one forward tile configuration, chosen at compile time, over part of the paper's grid:
// the data behind csrc/fwd_tile_config.h. Built and run by tune_fwd.sh, one binary per config.
#include <cstdio>
#include <cstdlib>

#include "flash_fwd_launch_template.h"

#define CUDA_OK(expr)                                                                     \
    do {                                                                                  \
        cudaError_t err_ = (expr);                                                        \
        if (err_ != cudaSuccess) {                                                        \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
            std::exit(1);                                                                 \
        }                                                                                 \
    } while (0)

using Element = cutlass::bfloat16_t;
using Traits = FwdKernelTraits<TUNE_HDIM, TUNE_BLOCK_M, TUNE_BLOCK_N, TUNE_WARPS, Element>;

// Standard-normal-ish values from a hash, so no two buffers (or runs) share data.
__global__ void fill_random(Element *x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
        x[i] = Element((float(h & 0xffff) / 65535.f - 0.5f) * 3.4641f);
    }
}

template <bool kIsCausal>
void time_config(int seqlen, uint32_t seed) {
    const int batch = 16384 / seqlen, nheads = 2048 / TUNE_HDIM, d = TUNE_HDIM;
    const int64_t numel = int64_t(batch) * seqlen * nheads * d;
    Element *q, *k, *v, *o;
    float *lse;
    CUDA_OK(cudaMalloc(&q, numel * sizeof(Element)));
    CUDA_OK(cudaMalloc(&k, numel * sizeof(Element)));
    CUDA_OK(cudaMalloc(&v, numel * sizeof(Element)));
    CUDA_OK(cudaMalloc(&o, numel * sizeof(Element)));
    CUDA_OK(cudaMalloc(&lse, int64_t(batch) * nheads * seqlen * sizeof(float)));
    fill_random<<<1024, 256>>>(q, numel, seed);
    fill_random<<<1024, 256>>>(k, numel, seed + 1);
    fill_random<<<1024, 256>>>(v, numel, seed + 2);

    Flash_fwd_params p{};
    p.q_ptr = q; p.k_ptr = k; p.v_ptr = v; p.o_ptr = o; p.softmax_lse_ptr = lse;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(seqlen) * nheads * d;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(nheads) * d;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
    p.batch = batch; p.seqlen_q = p.seqlen_k = seqlen; p.num_heads = p.num_heads_k = nheads; p.head_dim = d;
    p.softmax_scale = 1.f / std::sqrt(float(d));
    p.softmax_scale_log2 = p.softmax_scale * float(M_LOG2E);
    p.sm = 90;

    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    for (int i = 0; i < 5; ++i) launch_fwd<Traits, kIsCausal>(p, 0);
    CUDA_OK(cudaGetLastError());
    const int iters = 30;
    CUDA_OK(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) launch_fwd<Traits, kIsCausal>(p, 0);
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaGetLastError());
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    ms /= iters;
    const double flops = 4.0 * seqlen * double(seqlen) * d * nheads * batch / (kIsCausal ? 2 : 1);
    std::printf("hdim=%d block_m=%d block_n=%d warps=%d causal=%d seqlen=%d smem=%d ms=%.4f tflops=%.1f\n", TUNE_HDIM,
                TUNE_BLOCK_M, TUNE_BLOCK_N, TUNE_WARPS, int(kIsCausal), seqlen, Traits::kSmemSize, ms,
                flops / ms * 1e-9);
    CUDA_OK(cudaFree(q)); CUDA_OK(cudaFree(k)); CUDA_OK(cudaFree(v)); CUDA_OK(cudaFree(o)); CUDA_OK(cudaFree(lse));
}

int main() {
    for (int seqlen : {512, 2048, 8192}) {
        time_config<false>(seqlen, 17u * seqlen);
        time_config<true>(seqlen, 31u * seqlen);
    }
    return 0;
}
