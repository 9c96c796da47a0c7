// A counter in global memory that orders thread blocks: one waits until the count reaches its
// turn, does its work, then increments it for the next (deterministic dQ accumulation).
#pragma once

namespace flash {

// Called by every thread of the block; returns once *count == turn, with what the earlier blocks
// wrote before their release visible.
__device__ inline void semaphore_wait(const int *count, int turn) {
    if (threadIdx.x == 0) {
        int seen;
        do {
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
        } while (seen != turn);
    }
    __syncthreads();
}

// Called by every thread of the block after its writes: increments *count once they are all done.
__device__ inline void semaphore_release(int *count) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(count, 1);
    }
}

}  // namespace flash
