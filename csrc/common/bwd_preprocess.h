// Algorithm 2 lines 3-4, before either family's main backward kernel: D = rowsum(dO o O) in fp32
// and a zeroed fp32 dQ accumulator, for each sequence's rows rounded up to a multiple of kBlockM;
// where softmax_lse_log2_ptr is set (the Hopper backward), the logsumexp times log2(e) in the same
// rows, +inf past the sequence (so that those rows' P is 0).
#pragma once

#include <cmath>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/block_info.h"
#include "common/flash.h"

namespace flash {

// The preprocess kernel: each thread handles 16 bytes of a row.
constexpr int kRowKernelThreads = 256;

// A row of kHeadDim elements in kChunks chunks of 16 bytes, one per thread; the threads of a row
// are a power of two (the last ones idle when kChunks is not) so that a row stays in one warp.
template <typename Element, int kHeadDim>
struct RowChunks {
    static constexpr int kElems = 16 / sizeof(Element);
    static constexpr int kChunks = kHeadDim / kElems;
    static constexpr int kThreadsPerRow = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
    static_assert(kChunks <= 32);
    static constexpr int kRowsPerBlock = kRowKernelThreads / kThreadsPerRow;
    using Vec = cutlass::AlignedArray<Element, kElems, 16>;
    using FloatVec = cutlass::AlignedArray<float, kElems, 16>;

    // This thread's first column (kHeadDim and past: idle).
    __device__ static int col() { return threadIdx.x % kThreadsPerRow * kElems; }
};

// The preprocess grid: (row blocks x heads, batch), the head fastest, so that the blocks running at
// once read whole rows of O and dO ((batch, seqlen, heads, d)) rather than one head's 2 d bytes of
// rows heads x d apart.
template <typename Element, int kHeadDim, int kBlockM>
dim3 bwd_preprocess_grid(int seqlen_q, int batch, int num_heads) {
    const int rows = cute::ceil_div(seqlen_q, kBlockM) * kBlockM;
    return dim3(cute::ceil_div(rows, RowChunks<Element, kHeadDim>::kRowsPerBlock) * num_heads, batch);
}

template <typename Element, int kHeadDim, int kBlockM>
__global__ void __launch_bounds__(kRowKernelThreads) flash_bwd_preprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
    using Chunks = RowChunks<Element, kHeadDim>;
    const int bidh = blockIdx.x % params.num_heads;
    const int row = blockIdx.x / params.num_heads * Chunks::kRowsPerBlock + threadIdx.x / Chunks::kThreadsPerRow;
    const int col = Chunks::col();
    const int bidb = blockIdx.y;
    const BlockInfo binfo(params, bidb);

    const bool active = col < kHeadDim;
    float dot = 0.f;
    if (active && row < binfo.seqlen_q) {
        const auto &o = *reinterpret_cast<const typename Chunks::Vec *>(
            reinterpret_cast<const Element *>(params.o_ptr) + binfo.q_offset(params.o_batch_stride, params.o_row_stride) +
            row * params.o_row_stride + bidh * params.o_head_stride + col);
        const auto &d_o = *reinterpret_cast<const typename Chunks::Vec *>(
            reinterpret_cast<const Element *>(params.do_ptr) +
            binfo.q_offset(params.do_batch_stride, params.do_row_stride) + row * params.do_row_stride +
            bidh * params.do_head_stride + col);
        cutlass::NumericArrayConverter<float, Element, Chunks::kElems> to_float;
        const auto o_f = to_float(o);
        const auto do_f = to_float(d_o);
        for (int i = 0; i < Chunks::kElems; ++i) {
            dot += o_f[i] * do_f[i];
        }
    }
    for (int offset = Chunks::kThreadsPerRow / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffff, dot, offset);
    }
    if (active && row < cute::ceil_div(binfo.seqlen_q, kBlockM) * kBlockM) {
        const int64_t accum_row = binfo.accum_row0<kBlockM>(params, bidh) + row;
        if (col == 0) {
            params.softmax_d_ptr[accum_row] = dot;
            if (params.softmax_lse_log2_ptr != nullptr) {
                params.softmax_lse_log2_ptr[accum_row] =
                    row < binfo.seqlen_q ? params.softmax_lse_ptr[binfo.lse_row0(params, bidh) + row] * float(M_LOG2E)
                                         : INFINITY;
            }
        }
        float4 *dq = reinterpret_cast<float4 *>(params.dq_accum_ptr + accum_row * kHeadDim + col);
        for (int i = 0; i < Chunks::kElems / 4; ++i) {
            dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

}  // namespace flash
