// Which blocks a tile visits: the KV blocks a Q block needs (forward), the Q blocks a KV block
// feeds (backward). Every block outside the range is skipped whole; inside it, Mask::needed says
// which blocks carry masked entries. Both are the blocks that share a (row, key) pair inside the
// window (mask.h), so that KV block j is in Q block i's range iff i is in j's.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"

namespace flash {

// Block indices [begin, end); empty when begin >= end.
struct BlockRange {
    int begin, end;
};

// floor(x / block) for x possibly negative, clamped to [0, limit].
__device__ inline int block_index_clamped(int64_t x, int block, int limit) {
    return x < 0 ? 0 : int(min(x / block, int64_t(limit)));
}

// The KV blocks of block_n keys holding every key that some row of [row0, row0 + block_m) sees.
template <bool kIsCausal>
__device__ BlockRange kv_block_range(Mask<kIsCausal> const &mask, int row0, int block_m, int block_n) {
    const int n_blocks = cute::ceil_div(mask.seqlen_k, block_n);
    const int64_t first_key = int64_t(row0) + mask.causal_shift - mask.left();
    const int64_t last_key = int64_t(row0) + block_m - 1 + mask.causal_shift + mask.right();
    return {block_index_clamped(first_key, block_n, n_blocks), block_index_clamped(last_key + block_n, block_n, n_blocks)};
}

// The first KV block of the range from which on no key lies left of the window of any row of the
// tile: blocks [begin, this) need the left-edge mask.
template <bool kIsCausal>
__device__ int kv_block_left_edge_end(Mask<kIsCausal> const &mask, int row0, int block_m, int block_n) {
    const int64_t first_key_of_all = int64_t(row0) + block_m - 1 + mask.causal_shift - mask.left();
    return block_index_clamped(first_key_of_all + block_n - 1, block_n, cute::ceil_div(mask.seqlen_k, block_n));
}

// The Q blocks of block_m rows holding every row that sees some key of [col0, col0 + block_n): none
// when the keys lie past seqlen_k (varlen tiles are counted for the longest sequence).
template <bool kIsCausal>
__device__ BlockRange q_block_range(Mask<kIsCausal> const &mask, int col0, int block_m, int block_n, int seqlen_q) {
    if (col0 >= mask.seqlen_k) {
        return {0, 0};
    }
    const int m_blocks = cute::ceil_div(seqlen_q, block_m);
    const int64_t first_row = int64_t(col0) - mask.causal_shift - mask.right();
    const int64_t last_row = int64_t(col0) + block_n - 1 - mask.causal_shift + mask.left();
    return {block_index_clamped(first_row, block_m, m_blocks), block_index_clamped(last_row + block_m, block_m, m_blocks)};
}

}  // namespace flash
