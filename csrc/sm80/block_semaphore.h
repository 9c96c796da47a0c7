// The turn counter (common/turn_counter.h) for whole thread blocks: one waits until the count
// reaches its turn, does its work, then counts it done for the next (deterministic dQ accumulation).
#pragma once

#include "common/turn_counter.h"

namespace flash {

// Called by every thread of the block; returns once *count == turn, with what the earlier blocks
// wrote before their release visible.
__device__ inline void semaphore_wait(const int *count, int turn) {
    if (threadIdx.x == 0) {
        wait_for_turn(count, turn);
    }
    __syncthreads();
}

// Called by every thread of the block after its writes: increments *count once they are all done.
__device__ inline void semaphore_release(int *count) {
    __syncthreads();
    if (threadIdx.x == 0) {
        count_turn_done(count);
    }
}

}  // namespace flash
