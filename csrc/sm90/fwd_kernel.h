// FlashAttention-2 forward (Algorithm 1) for Hopper: a persistent, warp-specialized kernel. One
// block per SM walks its tiles (a 128- or 192-row block of Q of one (batch, head)); warpgroup 0
// loads Q, K and V by TMA, the other warpgroups compute with wgmma, 64 rows each.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "common/dependent_launch.h"
#include "sm90/fwd_consumer.h"
#include "sm90/fwd_kernel_traits.h"
#include "sm90/fwd_params.h"
#include "sm90/fwd_producer.h"
#include "sm90/tile_scheduler.h"

namespace flash::sm90 {

// A TMA pipeline's parameters: thread 0 (the producer thread) leads, every consumer thread
// releases.
template <class Traits, class Pipeline>
__device__ __forceinline__ typename Pipeline::Params tma_pipeline_params(bool is_producer, uint32_t transaction_bytes) {
    typename Pipeline::Params params;
    params.transaction_bytes = transaction_bytes;
    params.role = is_producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = Traits::kNumConsumerThreads;
    return params;
}

// kScoreMod: softcap and ALiBi (common/score_mod.h) on, a compile-time switch as in the FA2 family;
// kDropout: dropout too (fwd_consumer.h).
template <class Traits, bool kIsCausal, bool kScoreMod, bool kDropout>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ FwdKernelParams<Traits> kp) {
// Built for every arch in FLASH_ATTN_CUDA_ARCHS, run only on sm_90a: the device passes of other
// archs (sm80 in the default "80;90") compile an empty kernel, which the dispatcher never launches.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using SharedStorage = typename Traits::SharedStorage;
    using PipelineQ = typename Traits::PipelineQ;
    using PipelineKV = typename Traits::PipelineKV;
    extern __shared__ __align__(1024) char smem[];
    SharedStorage &shared = *reinterpret_cast<SharedStorage *>(smem);

    const bool is_producer = cutlass::canonical_warp_group_idx() == 0;

    // Thread 0 (warp 0) initializes every barrier; the pipelines' consumers are all the threads
    // of the consumer warpgroups. Q goes through a pipeline of its own, a stage per tile.
    PipelineQ pipeline_q(shared.pipeline_q, tma_pipeline_params<Traits, PipelineQ>(is_producer, Traits::kQBytes),
                         Shape<_1, _1, _1>{});
    const auto kv_params = tma_pipeline_params<Traits, PipelineKV>(is_producer, Traits::kKVStageBytes);
    PipelineKV pipeline_k(shared.pipeline_k, kv_params, Shape<_1, _1, _1>{});
    PipelineKV pipeline_v(shared.pipeline_v, kv_params, Shape<_1, _1, _1>{});
    if constexpr (Traits::kDynamicTiles) {
        if (threadIdx.x == 0) {
            shared.tile_ring.init(Traits::kNumConsumerThreads);
        }
    }
    if constexpr (Traits::kOBuffer) {
        if (threadIdx.x == 0) {
            shared.o_turns.init();
        }
    }
    cutlass::arch::fence_barrier_init();
    __syncthreads();
    // Launched dependent (fwd_launch.h): what the kernel before wrote is read from here on; the
    // kernel after (split-KV's merge) may start its blocks now.
    allow_next_grid();
    wait_for_previous_grid();

    if (is_producer) {
        cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
        if (threadIdx.x == 0) {
            fwd_producer<Traits, kIsCausal>(kp, shared, pipeline_q, pipeline_k, pipeline_v);
        }
    } else {
        cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
        fwd_consumer<Traits, kIsCausal, kScoreMod, kDropout>(kp, shared, pipeline_q, pipeline_k, pipeline_v,
                                                            threadIdx.x - 128);
    }
#endif
}

}  // namespace flash::sm90
