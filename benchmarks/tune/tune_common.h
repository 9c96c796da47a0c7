// What the tuning binaries share: error checks, random inputs, buffers for one shape of the
// paper's grid (batch = 16384 / seqlen, hidden 2048), and event timing.
#pragma once

#include <cmath>
#include <type_traits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cutlass/numeric_types.h>

#include "common/flash.h"

#define CUDA_OK(expr)                                                                         \
    do {                                                                                      \
        cudaError_t err_ = (expr);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

using Element = cutlass::bfloat16_t;

// Standard-normal-ish values from a hash, so no two buffers (or runs) share data.
__global__ void fill_random(Element *x, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        uint32_t h = uint32_t(i) * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
        x[i] = Element((float(h & 0xffff) / 65535.f - 0.5f) * 3.4641f);
    }
}

// Device buffers freed at scope exit.
struct Buffers {
    std::vector<void *> ptrs;
    template <typename T>
    T *alloc(int64_t numel) {
        void *p;
        CUDA_OK(cudaMalloc(&p, numel * sizeof(T)));
        ptrs.push_back(p);
        return static_cast<T *>(p);
    }
    Element *random(int64_t numel, uint32_t seed) {
        Element *p = alloc<Element>(numel);
        fill_random<<<1024, 256>>>(p, numel, seed);
        return p;
    }
    ~Buffers() {
        for (void *p : ptrs) cudaFree(p);
    }
};

// q, k, v random and o, lse allocated, for (batch, seqlen, nheads, d) tensors in one layout; no
// window beyond the causal bound (a zero-initialized window would be (0, 0): the diagonal alone).
inline void fill_grid_params(Flash_fwd_params &p, Buffers &buffers, int seqlen, int d, bool causal, uint32_t seed) {
    const int batch = 16384 / seqlen, nheads = 2048 / d;
    const int64_t numel = int64_t(batch) * seqlen * nheads * d;
    p.q_ptr = buffers.random(numel, seed);
    p.k_ptr = buffers.random(numel, seed + 1);
    p.v_ptr = buffers.random(numel, seed + 2);
    p.o_ptr = buffers.alloc<Element>(numel);
    p.softmax_lse_ptr = buffers.alloc<float>(int64_t(batch) * nheads * seqlen);
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(seqlen) * nheads * d;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(nheads) * d;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
    p.batch = batch;
    p.seqlen_q = p.seqlen_k = seqlen;
    p.num_heads = p.num_heads_k = nheads;
    p.head_dim = d;
    p.softmax_scale = 1.f / std::sqrt(float(d));
    p.softmax_scale_log2 = p.softmax_scale * float(M_LOG2E);
    p.is_bf16 = std::is_same_v<Element, cutlass::bfloat16_t>;
    p.window_left = kWindowUnbounded;
    p.window_right = causal ? 0 : kWindowUnbounded;
}

// Mean milliseconds of one launch over 30, after 5 warm-up launches.
template <class Launch>
float time_ms(Launch launch) {
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    for (int i = 0; i < 5; ++i) launch();
    CUDA_OK(cudaGetLastError());
    const int iters = 30;
    CUDA_OK(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) launch();
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaGetLastError());
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
    return ms / iters;
}

// The sequence lengths to time: $TUNE_SEQLENS (comma-separated) if set, else the defaults.
inline std::vector<int> seqlens_from_env(std::vector<int> defaults) {
    const char *env = std::getenv("TUNE_SEQLENS");
    if (env == nullptr) {
        return defaults;
    }
    std::vector<int> seqlens;
    for (char *end; *env != '\0'; env = *end == ',' ? end + 1 : end) {
        seqlens.push_back(static_cast<int>(std::strtol(env, &end, 10)));
        if (end == env) {
            std::fprintf(stderr, "TUNE_SEQLENS: expected comma-separated integers\n");
            std::exit(1);
        }
    }
    return seqlens;
}

inline double forward_flops(int seqlen, int d, bool causal) {
    return 4.0 * seqlen * double(seqlen) * d * (2048 / d) * (16384 / seqlen) / (causal ? 2 : 1);
}
