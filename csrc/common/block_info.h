// Where one (batch, head) sequence lives, padded and varlen alike: its lengths and the offsets of
// its first row in the inputs, outputs and fp32 buffers.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"

struct BlockInfo {
    int bidb;
    bool varlen;
    // Varlen: the sequence's first token in the packed tensors.
    int q_start, k_start;
    int seqlen_q, seqlen_k;

    // Varlen offsets are clamped to the tensors, so that cu_seqlens the host could not check
    // (under torch.compile or CUDA graph capture) give wrong rows at worst, never out-of-bounds ones.
    __device__ BlockInfo(const Flash_fwd_params &params, int bidb_)
        : bidb(bidb_), varlen(params.cu_seqlens_q != nullptr) {
        if (varlen) {
            q_start = clamp(params.cu_seqlens_q[bidb], 0, params.total_q);
            k_start = clamp(params.cu_seqlens_k[bidb], 0, params.total_k);
            seqlen_q = clamp(params.cu_seqlens_q[bidb + 1] - q_start, 0, min(params.seqlen_q, params.total_q - q_start));
            seqlen_k = clamp(params.cu_seqlens_k[bidb + 1] - k_start, 0, min(params.seqlen_k, params.total_k - k_start));
        } else {
            q_start = k_start = 0;
            seqlen_q = params.seqlen_q;
            seqlen_k = params.seqlen_k;
        }
    }

    // Causal masking is aligned to the bottom-right corner: query row i sees keys j <= i + shift.
    __device__ int causal_shift() const { return seqlen_k - seqlen_q; }

    // Element offset of the sequence's first row in a tensor laid out like q (or like k).
    __device__ int64_t q_offset(int64_t batch_stride, int64_t row_stride) const {
        return varlen ? q_start * row_stride : bidb * batch_stride;
    }
    __device__ int64_t k_offset(int64_t batch_stride, int64_t row_stride) const {
        return varlen ? k_start * row_stride : bidb * batch_stride;
    }

    // The (seqlen_q, kHeadDim) rows of one head of a tensor laid out like q.
    template <typename Element, int kHeadDim>
    __device__ auto q_rows(void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int head) const {
        return rows<Element, kHeadDim>(ptr, q_offset(batch_stride, row_stride), row_stride, head_stride, head, seqlen_q);
    }
    template <typename Element, int kHeadDim>
    __device__ auto k_rows(void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int head) const {
        return rows<Element, kHeadDim>(ptr, k_offset(batch_stride, row_stride), row_stride, head_stride, head, seqlen_k);
    }

    // Index of the sequence's first row in softmax_lse, for head bidh.
    __device__ int64_t lse_row0(const Flash_fwd_params &params, int bidh) const {
        return varlen ? int64_t(bidh) * params.total_q + q_start
                      : (int64_t(bidb) * params.num_heads + bidh) * params.seqlen_q;
    }

    // Index of the sequence's first row in the backward's fp32 buffers (dq_accum, softmax_d), for
    // head bidh: each sequence has its rows rounded up to a multiple of kBlockM there. Varlen:
    // sequence b starts at cu_seqlens_q[b] + b kBlockM rounded down to a multiple of kBlockM, so that
    // its blocks are aligned (the Hopper backward's bulk copies) and still clear of sequence b - 1's
    // rounded rows; all of them lie below total_q + batch kBlockM.
    template <int kBlockM>
    __device__ int64_t accum_row0(const Flash_bwd_params &params, int bidh) const {
        if (!varlen) {
            return (int64_t(bidb) * params.num_heads + bidh) * params.accum_rows;
        }
        return int64_t(bidh) * params.accum_rows + (int64_t(q_start) + int64_t(bidb) * kBlockM) / kBlockM * kBlockM;
    }

private:
    __device__ static int clamp(int x, int lo, int hi) { return max(lo, min(x, hi)); }

    template <typename Element, int kHeadDim>
    __device__ static auto rows(void *ptr, int64_t offset, int64_t row_stride, int64_t head_stride, int head,
                                int seqlen) {
        Element *base = reinterpret_cast<Element *>(ptr) + offset + head * head_stride;
        return cute::make_tensor(cute::make_gmem_ptr(base), cute::make_shape(seqlen, cute::Int<kHeadDim>{}),
                                 cute::make_stride(row_stride, cute::_1{}));
    }
};
