// Masks for one S = Q K^T tile: keys past seqlen_k, and keys outside the query row's window.
// Applied only on the tiles that need them.
//
// The window (flash-attn 2.x): with shift = seqlen_k - seqlen_q, query row i sees key j iff
// -left <= j - (i + shift) <= right. Causal is right = 0 (bottom-right aligned); kWindowUnbounded
// (flash.h) on a side means no bound there. j - i - shift lies in (-2^30, 2^30) for lengths below 2^30, so the bounds
// are compared on it without overflow.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/flash.h"

namespace flash {

using namespace cute;

template <bool kIsCausal>
struct Mask {
    int seqlen_k;
    int causal_shift;  // seqlen_k - seqlen_q
    int window_left = kWindowUnbounded;
    int window_right = kWindowUnbounded;

    __device__ int right() const { return kIsCausal ? 0 : window_right; }
    __device__ int left() const { return window_left; }

    // Whether the tile of rows [row0, row0 + block_m) and keys [col0, col0 + block_n) has any
    // masked entry. Uniform across the thread block, so the branch does not diverge.
    __device__ bool needed(int row0, int col0, int block_m, int block_n) const {
        const int last_col = col0 + block_n - 1;
        return last_col >= seqlen_k || last_col - row0 - causal_shift > right() ||
               col0 - (row0 + block_m - 1) - causal_shift < -left();
    }

    // Whether query row `row` sees key `col` (both in the sequence).
    __device__ bool visible(int row, int col) const {
        const int offset = col - row - causal_shift;
        return col < seqlen_k && offset <= right() && offset >= -left();
    }

    // acc_s: one thread's accumulator of S; coord: the (row, col) of each of its entries in the
    // tile; row0 / col0: the tile's origin in the sequence.
    template <class Acc, class Coord>
    __device__ void apply(Acc &acc_s, Coord const &coord, int row0, int col0) const {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
            if (!visible(row0 + get<0>(coord(i)), col0 + get<1>(coord(i)))) {
                acc_s(i) = -INFINITY;
            }
        }
    }
};

}  // namespace flash
