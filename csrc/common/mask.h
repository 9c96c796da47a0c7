// Masks for one S = Q K^T tile: keys past seqlen_k, and (causal) keys to the right of the
// bottom-right-aligned diagonal. Applied only on the tiles that need them.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

namespace flash {

using namespace cute;

template <bool kIsCausal>
struct Mask {
    int seqlen_k;
    int causal_shift;  // query row i sees keys j <= i + causal_shift

    // Whether the tile of rows [row0, row0 + block_m) and keys [col0, col0 + block_n) has any
    // masked entry. Uniform across the thread block, so the branch does not diverge.
    __device__ bool needed(int row0, int col0, int block_n) const {
        const int last_col = col0 + block_n - 1;
        return last_col >= seqlen_k || (kIsCausal && last_col > row0 + causal_shift);
    }

    // acc_s: one thread's accumulator of S; coord: the (row, col) of each of its entries in the
    // tile; row0 / col0: the tile's origin in the sequence.
    template <class Acc, class Coord>
    __device__ void apply(Acc &acc_s, Coord const &coord, int row0, int col0) const {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
            const int row = row0 + get<0>(coord(i));
            const int col = col0 + get<1>(coord(i));
            if (col >= seqlen_k || (kIsCausal && col > row + causal_shift)) {
                acc_s(i) = -INFINITY;
            }
        }
    }
};

}  // namespace flash
