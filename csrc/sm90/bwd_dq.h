// dQ of the Hopper backward: each block adds its partial dQ_i (a sum over its keys) into an fp32
// accumulator in global memory, which the postprocess scales and converts. A warpgroup's partial
// is laid out in its register order, value pair p of thread t at p * 256 + 2 t (so that a warp's
// stores cover 256 contiguous bytes): staged so in shared memory and added by one thread with one
// bulk reduction (cp.reduce.async.bulk), or (kDqStaged false) added pair by pair from registers.
// The accumulator keeps that order: Q block i of (batch, head) holds warpgroup 0's partial, then
// warpgroup 1's, where they split the columns; else both add into the one partial
// (bwd_kernel_traits.h, kDqSplitColumns).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "sm90/bwd_kernel_traits.h"

namespace flash::sm90 {

using namespace cute;

// Where value i of thread t (of 128 in its warpgroup) lives in a warpgroup's partial.
__host__ __device__ constexpr int dq_staging_index(int i, int t) { return i / 2 * 256 + 2 * t + i % 2; }

template <class Traits>
struct DqReduction {
    float *staging;  // this warpgroup's buffer
    int warpgroup, thread;

    __device__ DqReduction(typename Traits::SharedStorage &shared, int warpgroup_, int thread_)
        : staging(Traits::kDqStaged ? shared.dq.data() + warpgroup_ * Traits::kDqWarpgroupFloats : nullptr),
          warpgroup(warpgroup_), thread(thread_) {}

    // dst: Q block i's accumulator.
    template <class Acc>
    __device__ __forceinline__ void add(Acc const &acc_dq, float *dst) const {
        static_assert(decltype(size(acc_dq))::value * 128 == Traits::kDqWarpgroupFloats);
        float *partial = dst + (Traits::kDqSplitColumns ? warpgroup * Traits::kDqWarpgroupFloats : 0);
        if constexpr (!Traits::kDqStaged) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_dq); i += 2) {
                atomicAdd(reinterpret_cast<float2 *>(partial + dq_staging_index(i, thread)),
                          make_float2(acc_dq(i), acc_dq(i + 1)));
            }
            return;
        }
        // The previous reduction has read the buffer.
        if (thread == 0) {
            tma_store_wait<0>();
        }
        sync();
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 2) {
            *reinterpret_cast<float2 *>(staging + dq_staging_index(i, thread)) = make_float2(acc_dq(i), acc_dq(i + 1));
        }
        cutlass::arch::fence_view_async_shared();
        sync();
        if (thread == 0) {
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                         :
                         : "l"(partial), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(staging))),
                           "r"(uint32_t(Traits::kDqWarpgroupFloats * sizeof(float)))
                         : "memory");
            tma_store_arrive();
        }
    }

    // The last reduction has read the buffer before the block exits.
    __device__ __forceinline__ void finish() const {
        if (Traits::kDqStaged && thread == 0) {
            tma_store_wait<0>();
        }
    }

    // The 128 threads of this warpgroup.
    __device__ __forceinline__ void sync() const {
        cutlass::arch::NamedBarrier::sync(128, uint32_t(BwdBarrier::kDqStagingOfWarpgroup0) + warpgroup);
    }
};

}  // namespace flash::sm90
