// After the main backward kernel: dQ = softmax_scale * (the fp32 accumulator), converted to the
// input dtype (S was computed unscaled, so dS K lacks the scale). One thread block per Q block,
// each thread reading back what the same thread of the main kernel added (dq_accum.h), then
// writing the block out through shared memory so that the global stores are 16 bytes wide.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "sm80/dq_accum.h"
#include "common/flash.h"
#include "sm80/utils.h"

namespace flash {

using namespace cute;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads) flash_bwd_postprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kHeadDim = Traits::kHeadDim;
    extern __shared__ __align__(128) char smem[];
    const int m_block = blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int tidx = threadIdx.x;
    const BlockInfo binfo(params, bidb);
    const int row0 = m_block * kBlockM;
    if (row0 >= binfo.seqlen_q) {
        return;
    }

    auto tile_qo = Shape<Int<kBlockM>, Int<kHeadDim>>{};
    typename Traits::TiledMmadQ mma_dq;
    Tensor acc_dq = partition_fragment_C(mma_dq, tile_qo);
    const float *accum = params.dq_accum_ptr + (binfo.accum_row0<kBlockM>(params, bidh) + row0) * kHeadDim;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 4) {
        const float4 acc = *reinterpret_cast<const float4 *>(accum + dq_accum_index<Traits::kNThreads>(i, tidx));
        acc_dq(i) = acc.x * params.softmax_scale;
        acc_dq(i + 1) = acc.y * params.softmax_scale;
        acc_dq(i + 2) = acc.z * params.softmax_scale;
        acc_dq(i + 3) = acc.w * params.softmax_scale;
    }

    Tensor sdQ = make_tensor(make_smem_ptr(reinterpret_cast<Element *>(smem)), typename Traits::SmemLayoutQdO{});
    copy_acc_to_smem<typename Traits::SmemCopyAtomAcc>(mma_dq, convert_type<Element>(acc_dq), sdQ, tidx);
    __syncthreads();
    Tensor gdQ = local_tile(binfo.q_rows<Element, kHeadDim>(params.dq_ptr, params.dq_batch_stride, params.dq_row_stride,
                                                            params.dq_head_stride, bidh),
                            tile_qo, make_coord(m_block, 0));
    copy_smem_rows_to_gmem<typename Traits::GmemTiledCopyOut>(sdQ, gdQ, binfo.seqlen_q - row0, tidx);
}

}  // namespace flash
