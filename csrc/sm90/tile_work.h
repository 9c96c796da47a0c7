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
