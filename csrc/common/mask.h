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

    // Which of the mask's edges cut the tile of rows [row0, row0 + block_m) and keys
    // [col0, col0 + block_n): the end of the keys, the window's right edge (the causal diagonal),
    // its left edge. Uniform across the threads that share the tile.
    struct Edges {
        bool keys_end, right, left;
        __device__ bool any() const { return keys_end || right || left; }
    };
    __device__ Edges edges(int row0, int col0, int block_m, int block_n) const {
        const int last_col = col0 + block_n - 1;
        return {last_col >= seqlen_k, last_col - row0 - causal_shift > right(),
                col0 - (row0 + block_m - 1) - causal_shift < -left()};
    }

    // Whether the tile has any masked entry.
    __device__ bool needed(int row0, int col0, int block_m, int block_n) const {
        return edges(row0, col0, block_m, block_n).any();
    }

    // Whether query row `row` sees key `col` (both in the sequence).
    __device__ bool visible(int row, int col) const {
        const int offset = col - row - causal_shift;
        return col < seqlen_k && offset <= right() && offset >= -left();
    }

    // acc_s: one thread's accumulator of S (S^T with kTransposed); coord: the (row, col) of each of
    // its entries in the tile ((col, row) with kTransposed); row0 / col0: the tile's origin in the
    // sequence; edges: the tile's (or a part of it that holds all of the thread's entries). Each
    // edge that cuts it costs a compare and a select per entry: an entry's key and its j - i are
    // the thread's first entry's plus offsets that are compile-time constants in the MMA layouts,
    // so each bound is a compare of such a constant with one per-thread limit.
    template <bool kTransposed = false, class Acc, class Coord>
    __device__ void apply(Acc &acc_s, Coord const &coord, int row0, int col0, Edges const &edges) const {
        const auto row_of = [&](int i) { return kTransposed ? get<1>(coord(i)) : get<0>(coord(i)); };
        const auto col_of = [&](int i) { return kTransposed ? get<0>(coord(i)) : get<1>(coord(i)); };
        const auto key_step = [&](int i) { return col_of(i) - col_of(0); };
        const auto offset_step = [&](int i) { return key_step(i) - (row_of(i) - row_of(0)); };
        const auto mask_where = [&](auto masked) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) {
                acc_s(i) = masked(i) ? -INFINITY : acc_s(i);
            }
        };
        const int col_first = col0 + col_of(0);
        const int offset_first = col_first - (row0 + row_of(0)) - causal_shift;
        if (edges.keys_end) {
            const int keys_left = seqlen_k - col_first;
            mask_where([&](int i) { return key_step(i) >= keys_left; });
        }
        if (edges.right) {
            const int room = right() - offset_first;
            mask_where([&](int i) { return offset_step(i) > room; });
        }
        if (edges.left) {
            const int room = -left() - offset_first;
            mask_where([&](int i) { return offset_step(i) < room; });
        }
    }
};

}  // namespace flash
