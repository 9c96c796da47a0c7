// A counter in global memory that orders the adds of different thread blocks into the same memory
// (deterministic dQ): a writer waits until the count reaches its turn, adds, then counts its turn
// done, which lets the next writer in. Each call is made by one thread.
#pragma once

namespace flash {

// Returns once *count == turn; what the earlier writers wrote before counting their turns done is
// then visible to this thread.
__device__ inline void wait_for_turn(const int *count, int turn) {
    int seen;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen != turn);
}

// After this turn's writes (this thread's, and those of threads that synchronized with it since)
// are done: lets the next writer in.
__device__ inline void count_turn_done(int *count) {
    __threadfence();
    atomicAdd(count, 1);
}

}  // namespace flash
