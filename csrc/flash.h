// Plain parameter structs shared by flash_api.cpp and the kernels: no torch, no CuTe.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

struct Flash_fwd_params {
    // Tensors in (batch, seqlen, nheads, head_dim) layout with a contiguous last dim.
    void *__restrict__ q_ptr;
    void *__restrict__ k_ptr;
    void *__restrict__ v_ptr;
    void *__restrict__ o_ptr;
    // (batch, nheads, seqlen_q), contiguous.
    float *__restrict__ softmax_lse_ptr;

    int64_t q_batch_stride, k_batch_stride, v_batch_stride, o_batch_stride;
    int64_t q_row_stride, k_row_stride, v_row_stride, o_row_stride;
    int64_t q_head_stride, k_head_stride, v_head_stride, o_head_stride;

    int batch;
    int seqlen_q, seqlen_k;
    int num_heads, num_heads_k;
    // The real head dim (a multiple of 8, at most the kernel's kHeadDim).
    int head_dim;

    float softmax_scale;
    // softmax_scale * log2(e): the kernels exponentiate with exp2.
    float softmax_scale_log2;

    // Compute capability of the device (80, 86, 90...), for the dispatch table.
    int sm;
};

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream);
