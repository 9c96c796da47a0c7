// Where one (batch, head) sequence lives: lengths and element offsets into the padded tensors.
#pragma once

#include <cute/tensor.hpp>

#include "flash.h"

struct BlockInfo {
    int bidb;
    int seqlen_q;
    int seqlen_k;

    __device__ BlockInfo(const Flash_fwd_params &params, int bidb_)
        : bidb(bidb_), seqlen_q(params.seqlen_q), seqlen_k(params.seqlen_k) {}

    // Causal masking is aligned to the bottom-right corner: query row i sees keys j <= i + shift.
    __device__ int causal_shift() const { return seqlen_k - seqlen_q; }

    // The (seqlen, kHeadDim) rows of one head of a (batch, seqlen, nheads, kHeadDim) tensor.
    template <typename Element, int kHeadDim>
    __device__ auto rows(void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int head,
                         int seqlen) const {
        Element *base = reinterpret_cast<Element *>(ptr) + bidb * batch_stride + head * head_stride;
        return cute::make_tensor(cute::make_gmem_ptr(base), cute::make_shape(seqlen, cute::Int<kHeadDim>{}),
                                 cute::make_stride(row_stride, cute::_1{}));
    }
};
