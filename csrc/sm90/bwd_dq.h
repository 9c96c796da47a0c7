// dQ of the Hopper backward: each block adds its partial dQ_i (a sum over its keys) into an fp32
// accumulator in global memory, which the postprocess scales and converts. A warpgroup's partial
// is laid out in its register order, value pair p of thread t at p * 256 + 2 t (so that a warp's
// stores cover 256 contiguous bytes): staged so in shared memory and added by one thread with one
// bulk reduction (cp.reduce.async.bulk), or (kDqStaged false) added pair by pair from registers.
// The accumulator keeps that order: Q block i of (batch, head) holds warpgroup 0's partial, then
// warpgroup 1's, where they split the columns; else both add into the one partial
// (bwd_kernel_traits.h, kDqSplitColumns). At d = 64 and 128 (staged) the reduction of a Q
// block's partial starts a step later, under the next block's first GEMMs (d = 64 from two staging
// buffers in turn).
//
// Deterministic (kDeterministic; params.dq_semaphore_ptr): the adds into a partial come in a fixed
// order, the KV blocks of the Q block's range (common/block_range.h) in turn, warpgroup 0 before 1
// where both add into one partial, through a turn counter per (batch, head, Q block, partial)
// (common/turn_counter.h). An add's turn is passed on only once it has completed: in the next Q
// block's add (d = 64: under its first GEMMs), or at the end of the tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_range.h"
#include "common/global_reduce.h"
#include "common/turn_counter.h"
#include "sm90/bwd_kernel_traits.h"

namespace flash::sm90 {

using namespace cute;

// Where value i of thread t (of 128 in its warpgroup) lives in a warpgroup's partial.
__host__ __device__ constexpr int dq_staging_index(int i, int t) { return i / 2 * 256 + 2 * t + i % 2; }

// Where pred holds, waits until the bulk operations of all but this thread's kPendingGroups latest
// groups have read their sources (cp.async.bulk.wait_group.read), as a predicated instruction (no
// branch).
template <int kPendingGroups>
__device__ __forceinline__ void bulk_wait_read_if(bool pred) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p cp.async.bulk.wait_group.read %1;\n}" ::"r"(
                     uint32_t(pred)),
                 "n"(kPendingGroups)
                 : "memory");
}

// The async proxy's accesses (the bulk reductions) ordered with the generic proxy's: after a turn
// is seen, and before it is passed on.
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

template <class Traits, bool kDeterministic>
struct DqReduction {
    float *staging;  // this warpgroup's buffer
    // Thread 0's: the counter of a bulk reduction not yet counted done (in shared memory rather than
    // in registers through the loop).
    int **pending;
    int warpgroup, thread;

    __device__ DqReduction(typename Traits::SharedStorage &shared, int warpgroup_, int thread_)
        : staging(Traits::kDqStaged ? shared.dq.data() + warpgroup_ * Traits::kDqWarpgroupFloats : nullptr),
          pending(&shared.dq_pending[warpgroup_]), warpgroup(warpgroup_), thread(thread_) {
        if (kDeterministic && thread == 0) {
            *pending = nullptr;
        }
    }

    // Deterministic: waits until this warpgroup's turn at Q block m_block of block's (batch, head)
    // has come; returns its counter.
    template <class Block>
    __device__ __forceinline__ int *wait_for_dq_turn(Flash_bwd_params const &params, Block const &block,
                                                     int m_block) const {
        constexpr int kPartials = sm90_bwd_dq_partials(Traits::kHeadDim);
        constexpr int kBlockM = Traits::kBlockM;
        const int64_t q_block =
            (int64_t(block.bidb) * params.num_heads + block.bidh) * cute::ceil_div(params.seqlen_q, kBlockM) + m_block;
        const int place =
            block.n_block - kv_block_range(block.mask, m_block * kBlockM, kBlockM, Traits::kBlockN).begin;
        int *count = params.dq_semaphore_ptr + q_block * kPartials + (Traits::kDqSplitColumns ? warpgroup : 0);
        wait_for_turn(count, Traits::kDqSplitColumns ? place : 2 * place + warpgroup);
        return count;
    }

    // dst: Q block m_block's accumulator. Deterministic: the previous add's turn is passed on here,
    // a Q block's step after it was issued, when it has long completed.
    template <class Acc, class Block>
    __device__ __forceinline__ void add(Acc const &acc_dq, float *dst, Flash_bwd_params const &params,
                                        Block const &block, int m_block) const {
        static_assert(decltype(size(acc_dq))::value * 128 == Traits::kDqWarpgroupFloats);
        if constexpr (!Traits::kDqStaged) {
            float *partial = dst + (Traits::kDqSplitColumns ? warpgroup * Traits::kDqWarpgroupFloats : 0);
            if constexpr (kDeterministic) {
                release_pending();
                if (thread == 0) {
                    *pending = wait_for_dq_turn(params, block, m_block);
                }
                sync();
            }
            CUTE_UNROLL
            for (int i = 0; i < size(acc_dq); i += 2) {
                red_add2(partial + dq_staging_index(i, thread), acc_dq(i), acc_dq(i + 1));
            }
            return;
        }
        // The previous reduction has read the buffer.
        release_pending();
        if (thread == 0) {
            tma_store_wait<0>();
        }
        sync();
        write_staging(acc_dq, 0);
        sync();
        if (thread == 0) {
            if constexpr (kDeterministic) {
                *pending = wait_for_dq_turn(params, block, m_block);
                fence_async_global();
            }
            reduce_staged(dst, 0, true);
        }
    }

    // An add in two steps (staged, not deterministic): stage() the partial into a buffer
    // (alternating where there are two) right after its GEMM, start_reduction() of it a step
    // later, where it runs under the next Q block's first GEMMs (bwd_consumer.h). There no thread
    // may branch: ptxas waits for the wgmmas in flight before a divergent branch, so thread 0's
    // bulk operations are predicated instead.
    template <class Acc>
    __device__ __forceinline__ void stage(Acc const &acc_dq, int buffer) const {
        // The last reduction from this buffer has read it: the one before the latest with two
        // buffers, the latest (started under this step's first GEMMs, or at the previous tile's
        // end) with one.
        bulk_wait_read_if<Traits::kDqStagingBuffers - 1>(thread == 0);
        sync();
        write_staging(acc_dq, buffer);
    }
    // issue false: the barrier alone (the consumer's first step, which has no staged partial).
    __device__ __forceinline__ void start_reduction(float *dst, int buffer, bool issue) const {
        sync();
        reduce_staged(dst, buffer, thread == 0 && issue);
    }

    // Deterministic: once the last add has completed, the next writer of its partial may add. Called
    // by every thread of the warpgroup.
    __device__ __forceinline__ void release_pending() const {
        if constexpr (kDeterministic) {
            if constexpr (Traits::kDqStaged) {
                if (thread == 0 && *pending != nullptr) {
                    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
                    fence_async_global();
                }
            } else {
                __threadfence();  // this thread's reductions are performed
                sync();
            }
            if (thread == 0 && *pending != nullptr) {
                count_turn_done(*pending);
                *pending = nullptr;
            }
        }
    }

    // Deterministic, one partial (d = 64): warpgroup 1 adds after warpgroup 0 in every tile, so the
    // turn is passed on under the next Q block's first GEMMs rather than at its add a step later,
    // which left warpgroup 1 a step behind and its Q and dO stages late for warpgroup 0 (runs
    // 163-164). Two partials: at the add, by when the reduction has long completed.
    __device__ __forceinline__ void release_under_gemms() const {
        if constexpr (!Traits::kDqSplitColumns) {
            release_pending();
        }
    }

    // The last reduction has read the buffer (and, deterministic, completed) before the block exits.
    // Called by every thread of the warpgroup.
    __device__ __forceinline__ void finish() const {
        release_pending();
        if (Traits::kDqStaged && thread == 0) {
            tma_store_wait<0>();
        }
    }

    // Staging buffer `buffer` as free space for this warpgroup, once this thread's bulk reductions
    // but the kReductionsLeft latest have read their sources. Returns the buffer's start, which is
    // warpgroup 0's region: warpgroup w may use only the kDqWarpgroupFloats floats from w times that
    // on. Called by every thread of the warpgroup.
    template <int kReductionsLeft>
    __device__ __forceinline__ float *borrow(int buffer) const {
        bulk_wait_read_if<kReductionsLeft>(thread == 0);
        sync();
        return staging - warpgroup * Traits::kDqWarpgroupFloats +
               buffer * Traits::kDqWarpgroupFloats * Traits::kNumConsumerWarpgroups;
    }

    // The 128 threads of this warpgroup.
    __device__ __forceinline__ void sync() const {
        cutlass::arch::NamedBarrier::sync(128, uint32_t(BwdBarrier::kDqStagingOfWarpgroup0) + warpgroup);
    }

private:
    template <class Acc>
    __device__ __forceinline__ void write_staging(Acc const &acc_dq, int buffer) const {
        float *buf = staging + buffer * Traits::kDqWarpgroupFloats * Traits::kNumConsumerWarpgroups;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 2) {
            *reinterpret_cast<float2 *>(buf + dq_staging_index(i, thread)) = make_float2(acc_dq(i), acc_dq(i + 1));
        }
        cutlass::arch::fence_view_async_shared();
    }

    // The bulk reduction of a staged buffer into dst's partial, and its commit, where issue holds
    // (a predicated instruction, no branch).
    __device__ __forceinline__ void reduce_staged(float *dst, int buffer, bool issue) const {
        float *partial = dst + (Traits::kDqSplitColumns ? warpgroup * Traits::kDqWarpgroupFloats : 0);
        float const *buf = staging + buffer * Traits::kDqWarpgroupFloats * Traits::kNumConsumerWarpgroups;
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n"
            "@p cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
            "@p cp.async.bulk.commit_group;\n}"
            :
            : "l"(partial), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(buf))),
              "r"(uint32_t(Traits::kDqWarpgroupFloats * sizeof(float))), "r"(uint32_t(issue))
            : "memory");
    }
};

}  // namespace flash::sm90
