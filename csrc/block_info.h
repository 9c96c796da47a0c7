// Where one (batch, head) sequence lives: lengths and element offsets into the padded tensors.
#pragma once

#include "flash.h"

struct BlockInfo {
    int seqlen_q;
    int seqlen_k;

    __device__ BlockInfo(const Flash_fwd_params &params, int /*bidb*/)
        : seqlen_q(params.seqlen_q), seqlen_k(params.seqlen_k) {}

    __device__ static int64_t offset(int64_t batch_stride, int bidb) { return bidb * batch_stride; }

    // Causal masking is aligned to the bottom-right corner: query row i sees keys j <= i + shift.
    __device__ int causal_shift() const { return seqlen_k - seqlen_q; }
};
