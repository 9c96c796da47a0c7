// After the main backward kernel: dQ = softmax_scale * (the fp32 accumulator), converted to the
// input dtype (S was computed unscaled, so dS K lacks the scale). One thread block per Q block,
// each thread reading back what the same thread of the main kernel added (dq_accum.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "block_info.h"
#include "dq_accum.h"
#include "flash.h"

namespace flash {

using namespace cute;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads) flash_bwd_postprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    const int m_block = blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int tidx = threadIdx.x;
    const BlockInfo binfo(params, bidb);
    const int row0 = m_block * kBlockM;
    if (row0 >= binfo.seqlen_q) {
        return;
    }

    typename Traits::TiledMmadQ mma_dq;
    Tensor coord = mma_dq.get_thread_slice(tidx).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    const float *accum = params.dq_accum_ptr + (binfo.accum_row0<kBlockM>(params, bidh) + row0) * kHeadDim;
    Element *dq = reinterpret_cast<Element *>(params.dq_ptr) +
                  binfo.q_offset(params.dq_batch_stride, params.dq_row_stride) + bidh * params.dq_head_stride;
    cutlass::NumericArrayConverter<Element, float, 2> to_element;
    using Pair = cutlass::AlignedArray<Element, 2, 2 * sizeof(Element)>;
    CUTE_UNROLL
    for (int i = 0; i < size(coord); i += 4) {
        const float4 acc = *reinterpret_cast<const float4 *>(accum + dq_accum_index<Traits::kNThreads>(i, tidx));
        const float values[4] = {acc.x, acc.y, acc.z, acc.w};
        // Registers i, i + 1 (and i + 2, i + 3) are adjacent columns of one row.
        CUTE_UNROLL
        for (int j = 0; j < 4; j += 2) {
            const int row = row0 + get<0>(coord(i + j));
            if (row < binfo.seqlen_q) {
                cutlass::Array<float, 2> pair;
                pair[0] = values[j] * params.softmax_scale;
                pair[1] = values[j + 1] * params.softmax_scale;
                Pair out;
                static_cast<cutlass::Array<Element, 2> &>(out) = to_element(pair);
                *reinterpret_cast<Pair *>(dq + int64_t(row) * params.dq_row_stride + get<1>(coord(i + j))) = out;
            }
        }
    }
}

}  // namespace flash
