// One tile's work, derived the same way by the producer and by the consumers, so that they agree
// on which KV blocks go through the pipeline.
#pragma once

#include "common/block_info.h"
#include "common/block_range.h"
#include "common/mask.h"
#include "sm90/fwd_params.h"
#include "sm90/tile_scheduler.h"

namespace flash::sm90 {

template <bool kIsCausal>
struct TileWork {
    TileCoord tc;
    BlockInfo binfo;
    int row0;  // of the sequence; negative where the tile starts above it (causal_row_shift)
    Mask<kIsCausal> mask;
    BlockRange n_blocks;

    // No row of the tile lies in its sequence (varlen: a sequence shorter than the longest).
    __device__ bool empty() const { return row0 >= binfo.seqlen_q; }

    // The KV blocks that rows [first_row, first_row + rows) of the tile see, those in the sequence:
    // a part of n_blocks that ends with it when empty. Fewer than the tile's where a window or the
    // causal diagonal cuts a tall tile, or the sequence starts or ends inside it.
    template <int kBlockN>
    __device__ BlockRange blocks_of_rows(int first_row, int rows) const {
        const int first = max(first_row, 0);
        const int rows_in = min(first_row + rows, binfo.seqlen_q) - first;
        const BlockRange range = rows_in > 0 ? kv_block_range(mask, first, rows_in, kBlockN) : BlockRange{0, 0};
        return range.begin < range.end ? range : BlockRange{n_blocks.end, n_blocks.end};
    }
};

// The rows by which a causal sequence's tiles start above m_block * block_m: its last tile ends with
// it, so that the tile that pads rows is the first, which sees the fewest keys, not the last, which
// sees the most (d=64's 192-row tiles at 1k rows: the last tile's 64 rows in one warpgroup, its 8
// blocks without a partner in the turns; benchmarks/NOTES.md, run 260). The TMA reads rows above
// the sequence (zeros, or a varlen sequence's predecessor), and the epilogue writes none of them. A
// window with a left edge gives the tiles about the same keys, and keeps them where they were; so
// does dropout, whose Philox calls span rows 16 I + r and 16 I + r + 8 (common/dropout.h), which a
// tile shifted by other than a multiple of 16 rows would split.
template <bool kIsCausal>
__device__ __forceinline__ int causal_row_shift(Mask<kIsCausal> const &mask, bool dropout, int seqlen_q, int block_m) {
    const bool left_unbounded = mask.left() == kWindowUnbounded || mask.left() >= mask.seqlen_k;
    return kIsCausal && left_unbounded && !dropout ? cute::ceil_div(seqlen_q, block_m) * block_m - seqlen_q : 0;
}

template <class Traits, bool kIsCausal>
__device__ __forceinline__ TileWork<kIsCausal> tile_work(FwdKernelParams<Traits> const &kp, int64_t tile) {
    Flash_fwd_params const &params = kp.params;
    const TileCoord tc = kp.scheduler.template coord<kIsCausal>(tile);
    const BlockInfo binfo(params, tc.bidb);
    const Mask<kIsCausal> mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right};
    // Split-block kernels keep a tile's rows (at most 64) in warpgroup 0's half.
    const int row0 = tc.m_block * Traits::kBlockM -
                     (Traits::kSplitBlocks ? 0 : causal_row_shift(mask, params.p_dropout > 0.f, binfo.seqlen_q,
                                                                  Traits::kBlockM));
    const int first_row = max(row0, 0);
    return {tc, binfo, row0, mask, kv_block_range(mask, first_row, row0 + Traits::kBlockM - first_row, Traits::kBlockN)};
}

}  // namespace flash::sm90
