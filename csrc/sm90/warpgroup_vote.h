// A vote among the 128 threads of a warpgroup (bar.red.or): a warp-uniform answer is not enough
// where the answer decides whether the warpgroup issues a wgmma, which all four warps must.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace flash::sm90 {

// Whether pred holds in any thread of the warpgroup. barrier: a named barrier id of the family's
// (as NamedBarrier takes them) that only this warpgroup's threads use.
__device__ __forceinline__ bool warpgroup_any(bool pred, uint32_t barrier) {
    const uint32_t id = barrier + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount;
    uint32_t any;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.b32 p, %1, 0;\nbar.red.or.pred q, %2, 128, p;\nselp.b32 %0, 1, 0, q;\n}"
        : "=r"(any)
        : "r"(uint32_t(pred)), "r"(id)
        : "memory");
    // The same in every lane; through a warp vote, so that ptxas knows it to be warp-uniform (a branch
    // on the barrier's result alone moved the wgmma descriptors of the code around it out of the
    // uniform registers).
    return __any_sync(0xffffffff, any != 0);
}

}  // namespace flash::sm90
