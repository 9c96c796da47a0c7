// The Hopper backward's host-side facts (plain C++, for family.cpp): its Q block height, and where
// it serves faster than the FA2 family's.
#pragma once

namespace flash::sm90 {

// Query rows per step of the backward (bwd_kernel_traits.h), and so the rounding of its workspace
// rows (family.cpp).
constexpr int sm90_bwd_block_m = 64;

// The shortest query length per head dim at which the Hopper backward beat the FA2 family in the
// grid (run 86, benchmarks/NOTES.md): below it, each block walks too few Q blocks to pay for
// loading K and V and writing dK and dV, which nothing overlaps (one block per SM). A causal
// block walks half as many on average.
constexpr int sm90_bwd_min_seqlen_q(int head_dim, bool causal) {
    return head_dim >= 128 ? 1024 : causal ? 4096 : 2048;
}

// Whether the main kernel runs one block per SM, each walking every gridDim.x-th tile, so that a
// tile's K and V load and the previous tile's dK and dV stores overlap: where the tiles cost about
// the same. Causal tiles without a left window bound cost from one Q block to all of them; there
// each tile gets a block of its own, which the hardware hands to the next free SM (greedy).
constexpr bool sm90_bwd_persistent(bool causal, bool window_left_bounded) { return !causal || window_left_bounded; }

}  // namespace flash::sm90
