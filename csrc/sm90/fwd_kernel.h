// FlashAttention-2 forward (Algorithm 1) for Hopper: a persistent, warp-specialized kernel. One
// block per SM walks its tiles (a 128- or 192-row block of Q of one (batch, head)); warpgroup 0
// loads Q, K and V by TMA, the other warpgroups compute with wgmma, 64 rows each.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90/fwd_consumer.h"
#include "sm90/fwd_kernel_traits.h"
#include "sm90/fwd_params.h"
#include "sm90/fwd_producer.h"
#include "sm90/tile_scheduler.h"

namespace flash::sm90 {

// kScoreMod: softcap and ALiBi (common/score_mod.h) on, a compile-time switch as in the FA2 family;
// kDropout: dropout too (fwd_consumer.h).
template <class Traits, bool kIsCausal, bool kScoreMod, bool kDropout>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ FwdKernelParams<Traits> kp) {
// Built for every arch in FLASH_ATTN_CUDA_ARCHS, run only on sm_90a: the device passes of other
// archs (sm80 in the default "80;90") compile an empty kernel, which the dispatcher never launches.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineKV = typename Traits::PipelineKV;
    extern __shared__ __align__(1024) char smem[];
    SharedStorage &shared = *reinterpret_cast<SharedStorage *>(smem);

    const bool is_producer = cutlass::canonical_warp_group_idx() == 0;

    // Thread 0 (warp 0) initializes every barrier; the pipelines' consumers are all the threads
    // of the consumer warpgroups.
    typename PipelineKV::Params pipeline_params;
    pipeline_params.transaction_bytes = Traits::kKVStageBytes;
    pipeline_params.role = is_producer ? PipelineKV::ThreadCategory::Producer : PipelineKV::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = Traits::kNumConsumerThreads;
    PipelineKV pipeline_k(shared.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
    PipelineKV pipeline_v(shared.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
    if (threadIdx.x == 0) {
        cutlass::arch::ClusterTransactionBarrier::init(&shared.q_full, 1);
        cutlass::arch::ClusterBarrier::init(&shared.q_free, Traits::kQFreeArrivals);
        if constexpr (Traits::kDynamicTiles) {
            shared.tile_ring.init(Traits::kNumConsumerThreads);
        }
    }
    cutlass::arch::fence_barrier_init();
    __syncthreads();

    if (is_producer) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0) {
            fwd_producer<Traits, kIsCausal>(kp, shared, pipeline_k, pipeline_v);
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        fwd_consumer<Traits, kIsCausal, kScoreMod, kDropout>(kp, shared, pipeline_k, pipeline_v, threadIdx.x - 128);
    }
#endif
}

}  // namespace flash::sm90
