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
    int row0;
    Mask<kIsCausal> mask;
    BlockRange n_blocks;

    // No row of the tile lies in its sequence (varlen: a sequence shorter than the longest).
    __device__ bool empty() const { return row0 >= binfo.seqlen_q; }

    // The KV blocks that rows [first_row, first_row + rows) of the tile see, those in the sequence:
    // a part of n_blocks that ends with it when empty. Fewer than the tile's where a window or the
    // causal diagonal cuts a tall tile, or the sequence ends inside it.
    template <int kBlockN>
    __device__ BlockRange blocks_of_rows(int first_row, int rows) const {
        const int rows_in = min(rows, binfo.seqlen_q - first_row);
        const BlockRange range = rows_in > 0 ? kv_block_range(mask, first_row, rows_in, kBlockN) : BlockRange{0, 0};
        return range.begin < range.end ? range : BlockRange{n_blocks.end, n_blocks.end};
    }
};

template <class Traits, bool kIsCausal>
__device__ __forceinline__ TileWork<kIsCausal> tile_work(FwdKernelParams<Traits> const &kp, int64_t tile) {
    Flash_fwd_params const &params = kp.params;
    const TileCoord tc = kp.scheduler.template coord<kIsCausal>(tile);
    const BlockInfo binfo(params, tc.bidb);
    const int row0 = tc.m_block * Traits::kBlockM;
    const Mask<kIsCausal> mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right};
    return {tc, binfo, row0, mask, kv_block_range(mask, row0, Traits::kBlockM, Traits::kBlockN)};
}

}  // namespace flash::sm90
