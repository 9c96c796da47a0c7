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

template <class Traits, bool kIsCausal, bool kVariants, bool kDeterministic>
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
        if constexpr (sm90_bwd_dynamic_tiles(kIsCausal, kDeterministic)) {
            shared.tile_ring.init(Traits::kNumConsumerThreads);
        }
    }
    cutlass::arch::fence_barrier_init();
    __syncthreads();

    if (is_producer) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0) {
            cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
            cute::prefetch_tma_descriptor(kp.tma_do.get_tma_descriptor());
            bwd_producer<Traits, kIsCausal, sm90_bwd_dynamic_tiles(kIsCausal, kDeterministic)>(kp, shared, pipeline_q,
                                                                                               pipeline_do);
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        bwd_consumer<Traits, kIsCausal, kVariants, kDeterministic>(kp, shared, pipeline_q, pipeline_do,
                                                                   threadIdx.x - 128);
    }
#endif
}

// dQ = softmax_scale * the accumulated dS K (Algorithm 2 line 15's sums), in dq's dtype: one block
// of kDqThreads threads per Q block, each thread reading back the values it held in the main
// kernel's register order (bwd_dq.h) into a row-major tile in shared memory, from which whole
// rows go out in 16-byte stores (storing the fragment directly, 8 rows x 16 bytes per warp
// instruction, ran at a third of the bandwidth).
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads)
    flash_bwd_sm90_postprocess_kernel(const __grid_constant__ Flash_bwd_params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM, kHeadDim = Traits::kHeadDim;
    constexpr int kChunkElems = 16 / sizeof(Element);
    constexpr int kChunksPerRow = kHeadDim / kChunkElems;
    // One chunk of padding per row: the 8 rows a warp's fragment store covers fall on distinct banks.
    constexpr int kRowElems = kHeadDim + kChunkElems;
    __shared__ __align__(16) Element tile[kBlockM * kRowElems];

    const int m_block = blockIdx.x, bidh = blockIdx.y, bidb = blockIdx.z;
    const BlockInfo binfo(params, bidb);
    const int row0 = m_block * kBlockM;
    // The grid spans the longest sequence; a varlen sequence's accumulator rows end with its last
    // Q block (the last sequence's with the buffer).
    if (row0 >= binfo.seqlen_q) {
        return;
    }
    typename Traits::TiledMmaDQ mma_dq;
    Tensor coord = mma_dq.get_thread_slice(threadIdx.x)
                       .partition_C(make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
    float const *partial = params.dq_accum_ptr +
                           (binfo.template accum_row0<kBlockM>(params, bidh) + row0) * kHeadDim +
                           (Traits::kDqSplitColumns ? threadIdx.x / 128 * Traits::kDqWarpgroupFloats : 0);
    constexpr int kPairs = decltype(size(coord))::value / 2;
    float2 values[kPairs];
    CUTE_UNROLL
    for (int p = 0; p < kPairs; ++p) {
        values[p] = *reinterpret_cast<float2 const *>(partial + dq_staging_index(2 * p, threadIdx.x % 128));
    }
    cutlass::NumericArrayConverter<Element, float, 2> to_element;
    CUTE_UNROLL
    for (int p = 0; p < kPairs; ++p) {
        const cutlass::Array<float, 2> pair{values[p].x * params.softmax_scale, values[p].y * params.softmax_scale};
        *reinterpret_cast<cutlass::Array<Element, 2> *>(tile + get<0>(coord(2 * p)) * kRowElems +
                                                        get<1>(coord(2 * p))) = to_element(pair);
    }
    __syncthreads();

    Element *dq = static_cast<Element *>(params.dq_ptr) + binfo.q_offset(params.dq_batch_stride, params.dq_row_stride) +
                  int64_t(bidh) * params.dq_head_stride;
    CUTE_UNROLL
    for (int chunk = threadIdx.x; chunk < kBlockM * kChunksPerRow; chunk += Traits::kDqThreads) {
        const int row = chunk / kChunksPerRow, col = chunk % kChunksPerRow * kChunkElems;
        if (row0 + row < binfo.seqlen_q) {
            *reinterpret_cast<uint4 *>(dq + int64_t(row0 + row) * params.dq_row_stride + col) =
                *reinterpret_cast<uint4 const *>(tile + row * kRowElems + col);
        }
    }
#endif
}

}  // namespace flash::sm90
