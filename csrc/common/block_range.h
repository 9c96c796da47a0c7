// Which blocks a tile visits: the KV blocks a Q block needs (forward), the Q blocks a KV block
// feeds (backward). Every block outside the range is skipped whole; inside it, Mask::needed says
// which blocks carry masked entries.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"

namespace flash {

// Block indices [begin, end); empty when begin >= end.
struct BlockRange {
    int begin, end;
};

// The KV blocks of block_n keys holding every key that some row of [row0, row0 + block_m) sees.
template <bool kIsCausal>
__device__ BlockRange kv_block_range(Mask<kIsCausal> const &mask, int row0, int block_m, int block_n) {
    int end = cute::ceil_div(mask.seqlen_k, block_n);
    if constexpr (kIsCausal) {
        end = min(end, cute::ceil_div(max(0, row0 + block_m + mask.causal_shift), block_n));
    }
    return {0, end};
}

// The Q blocks of block_m rows holding every row that sees some key of [col0, col0 + block_n)
// (causal: row i sees key j iff i >= j - shift).
template <bool kIsCausal>
__device__ BlockRange q_block_range(Mask<kIsCausal> const &mask, int col0, int block_m, int seqlen_q) {
    int begin = 0;
    if constexpr (kIsCausal) {
        begin = max(0, col0 - mask.causal_shift) / block_m;
    }
    return {begin, cute::ceil_div(seqlen_q, block_m)};
}

}  // namespace flash
