// Ping-pong of the consumer warpgroups: they take turns, in order, issuing their GEMMs, so that
// the tensor cores run one warpgroup's GEMMs while the others compute their softmax. Each issue
// is bracketed by wait() and pass(). The forward (fwd_consumer.h): every warpgroup takes as many
// turns per tile (one per KV block of the tile and one more; those of blocks its rows do not see
// without a GEMM), so the turns carry over from tile to tile. The d = 64 backward (bwd_consumer.h):
// two turns per Q block, half a step apart.
#pragma once

#include <cutlass/arch/barrier.h>


namespace flash::sm90 {

// kFirstBarrier: the named barrier of warpgroup 0's turn (the others follow it), from the family's
// barrier ids.
template <int kNumWarpgroups, uint32_t kFirstBarrier>
struct WarpgroupTurns {
    static_assert(kNumWarpgroups >= 1 && kNumWarpgroups <= 3);
    int warpgroup;  // among the consumer warpgroups

    // Warpgroup 0 has the first turn.
    __device__ __forceinline__ explicit WarpgroupTurns(int warpgroup_) : warpgroup(warpgroup_) {
        if (kNumWarpgroups > 1 && warpgroup == kNumWarpgroups - 1) {
            cutlass::arch::NamedBarrier::arrive(256, barrier(0));
        }
    }

    __device__ __forceinline__ void wait() const {
        if constexpr (kNumWarpgroups > 1) {
            cutlass::arch::NamedBarrier::sync(256, barrier(warpgroup));
        }
    }

    __device__ __forceinline__ void pass() const {
        if constexpr (kNumWarpgroups > 1) {
            cutlass::arch::NamedBarrier::arrive(256, barrier((warpgroup + 1) % kNumWarpgroups));
        }
    }

    // A turn without a GEMM, so that the turns stay in step.
    __device__ __forceinline__ void skip() const {
        wait();
        pass();
    }

private:
    __device__ __forceinline__ static uint32_t barrier(int warpgroup) {
        return kFirstBarrier + warpgroup;
    }
};

}  // namespace flash::sm90
