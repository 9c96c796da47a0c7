// What one block of the Hopper backward works on: its keys, its (batch, head), the mask, and the
// Q blocks that see any of its keys (common/block_range.h). The producer and the consumers derive
// it alike from the block index.
#pragma once

#include "common/block_info.h"
#include "common/block_range.h"
#include "common/flash.h"
#include "common/mask.h"

namespace flash::sm90 {

template <class Traits, bool kIsCausal>
struct BwdBlock {
    int n_block, bidh, bidb;
    BlockInfo binfo;
    Mask<kIsCausal> mask;
    BlockRange m_blocks;

    __device__ BwdBlock(Flash_bwd_params const &params)
        : n_block(blockIdx.x), bidh(blockIdx.y), bidb(blockIdx.z), binfo(params, bidb),
          mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right},
          m_blocks(q_block_range(mask, n_block * Traits::kBlockN, Traits::kBlockM, Traits::kBlockN, binfo.seqlen_q)) {}

    __device__ int col0() const { return n_block * Traits::kBlockN; }
};

}  // namespace flash::sm90
