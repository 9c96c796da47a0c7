// After the main backward kernel: dQ = softmax_scale * (the fp32 accumulator), converted to the
// input dtype (S was computed unscaled, so dS K lacks the scale).
#pragma once

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "flash.h"
#include "flash_bwd_preprocess_kernel.h"

namespace flash {

template <typename Element, int kHeadDim, int kBlockM>
__global__ void __launch_bounds__(kRowKernelThreads) flash_bwd_postprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
    using Chunks = RowChunks<Element, kHeadDim>;
    const int row = Chunks::row();
    const int col = Chunks::col();
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const BlockInfo binfo(params, bidb);
    if (row >= binfo.seqlen_q || col >= kHeadDim) {
        return;
    }
    const int64_t accum_row = binfo.accum_row0<kBlockM>(params, bidh) + row;
    typename Chunks::FloatVec acc = *reinterpret_cast<const typename Chunks::FloatVec *>(
        params.dq_accum_ptr + accum_row * kHeadDim + col);
    for (int i = 0; i < Chunks::kElems; ++i) {
        acc[i] *= params.softmax_scale;
    }
    cutlass::NumericArrayConverter<Element, float, Chunks::kElems> to_element;
    typename Chunks::Vec out;
    static_cast<cutlass::Array<Element, Chunks::kElems> &>(out) = to_element(acc);
    *reinterpret_cast<typename Chunks::Vec *>(reinterpret_cast<Element *>(params.dq_ptr) +
                                              binfo.q_offset(params.dq_batch_stride, params.dq_row_stride) +
                                              row * params.dq_row_stride + bidh * params.dq_head_stride + col) = out;
}

}  // namespace flash
