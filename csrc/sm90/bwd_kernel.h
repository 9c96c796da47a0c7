// FlashAttention-2 backward (Algorithm 2) for Hopper: a block works through tiles of kBlockN keys
// of one (batch, head) (bwd_block.h); warpgroup 0 loads by TMA, two consumer warpgroups compute
// with wgmma, 64 keys each (bwd_kernel_traits.h). dQ is completed by bwd_postprocess_kernel.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90/bwd_consumer.h"
#include "sm90/bwd_kernel_traits.h"
#include "sm90/bwd_params.h"
#include "sm90/bwd_producer.h"

namespace flash::sm90 {

template <class Traits, bool kIsCausal, bool kVariants>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdKernelParams<Traits> kp) {
// Compiled to an empty kernel for the other archs of the build, as the forward (fwd_kernel.h).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    extern __shared__ __align__(1024) char smem[];
    SharedStorage &shared = *reinterpret_cast<SharedStorage *>(smem);

    const bool is_producer = cutlass::canonical_warp_group_idx() == 0;
    typename PipelineQ::Params pipeline_params;
    pipeline_params.transaction_bytes = Traits::kStageBytes;
    pipeline_params.role = is_producer ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = Traits::kNumConsumerThreads;
    PipelineQ pipeline_q(shared.pipeline_q, pipeline_params, Shape<_1, _1, _1>{});
    PipelineQ pipeline_do(shared.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});
    if (threadIdx.x == 0) {
        cutlass::arch::ClusterTransactionBarrier::init(&shared.kv_full, 1);
        cutlass::arch::ClusterBarrier::init(&shared.kv_empty, Traits::kNumConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
    __syncthreads();

    if (is_producer) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0) {
            cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
            cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
            bwd_producer<Traits, kIsCausal>(kp, shared, pipeline_q, pipeline_do);
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        bwd_consumer<Traits, kIsCausal, kVariants>(kp, shared, pipeline_q, pipeline_do, threadIdx.x - 128);
    }
#endif
}

// dQ = softmax_scale * the accumulated dS K (Algorithm 2 line 15's sums), in dq's dtype: one block
// of kDqThreads threads per Q block, each thread reading back the values it held in the main
// kernel's register order (bwd_dq.h).
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads)
    flash_bwd_sm90_postprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Element = typename Traits::Element;
    const int m_block = blockIdx.x, bidh = blockIdx.y, bidb = blockIdx.z;
    const BlockInfo binfo(params, bidb);
    typename Traits::TiledMmaDQ mma_dq;
    Tensor coord = mma_dq.get_thread_slice(threadIdx.x)
                       .partition_C(make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
    const int row0 = m_block * Traits::kBlockM;
    float const *partial = params.dq_accum_ptr +
                           (binfo.template accum_row0<Traits::kBlockM>(params, bidh) + row0) * Traits::kHeadDim +
                           (Traits::kDqSplitColumns ? threadIdx.x / 128 * Traits::kDqWarpgroupFloats : 0);
    Element *dq = static_cast<Element *>(params.dq_ptr) + binfo.q_offset(params.dq_batch_stride, params.dq_row_stride) +
                  int64_t(bidh) * params.dq_head_stride;
    CUTE_UNROLL
    for (int i = 0; i < size(coord); i += 2) {
        const int row = row0 + get<0>(coord(i));
        if (row < binfo.seqlen_q) {
            const float2 v = *reinterpret_cast<float2 const *>(partial + dq_staging_index(i, threadIdx.x % 128));
            cutlass::NumericArrayConverter<Element, float, 2> to_element;
            const cutlass::Array<float, 2> pair{v.x * params.softmax_scale, v.y * params.softmax_scale};
            *reinterpret_cast<cutlass::Array<Element, 2> *>(dq + int64_t(row) * params.dq_row_stride +
                                                            get<1>(coord(i))) = to_element(pair);
        }
    }
#endif
}

}  // namespace flash::sm90
