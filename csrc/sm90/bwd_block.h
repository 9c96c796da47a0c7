// What one tile of the Hopper backward works on: its keys, its (batch, head), the mask, and the Q
// blocks that see any of its keys (common/block_range.h; none for a varlen tile past its sequence's
// keys). The producer and the consumers derive it alike from the tile index. Tiles are numbered KV
// block fastest, then head, then batch (the blocks running at once share their Q and dO in L2);
// which block takes which tile: bwd_config.h (sm90_bwd_persistent, sm90_bwd_dynamic_tiles).
// Deterministic (bwd_dq.h): head fastest, then batch, then KV block, so that KV block j of a head,
// which adds into each of its Q blocks after block j - 1 of that head has, is scheduled a round of
// tiles after it instead of beside it, waiting.
#pragma once

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/block_range.h"
#include "common/flash.h"
#include "common/mask.h"

namespace flash::sm90 {

template <class Traits>
__host__ __device__ inline int bwd_num_n_blocks(Flash_bwd_params const &params) {
    return (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
}

template <class Traits>
__host__ __device__ inline int bwd_num_tiles(Flash_bwd_params const &params) {
    return bwd_num_n_blocks<Traits>(params) * params.num_heads * params.batch;
}

struct BwdTileCoord {
    int n_block, bidh, bidb;
};

template <class Traits>
__device__ inline BwdTileCoord bwd_tile_coord(Flash_bwd_params const &params, int tile) {
    if (params.dq_semaphore_ptr != nullptr) {
        const int heads = params.num_heads * params.batch;
        return {tile / heads, tile % heads % params.num_heads, tile % heads / params.num_heads};
    }
    const int n_blocks = bwd_num_n_blocks<Traits>(params);
    return {tile % n_blocks, tile / n_blocks % params.num_heads, tile / n_blocks / params.num_heads};
}

template <class Traits, bool kIsCausal>
struct BwdBlock {
    int n_block, bidh, bidb;
    BlockInfo binfo;
    Mask<kIsCausal> mask;
    BlockRange m_blocks;

    __device__ BwdBlock(Flash_bwd_params const &params, int tile)
        : BwdBlock(params, bwd_tile_coord<Traits>(params, tile)) {}

    __device__ BwdBlock(Flash_bwd_params const &params, BwdTileCoord c)
        : n_block(c.n_block), bidh(c.bidh), bidb(c.bidb), binfo(params, bidb),
          mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right},
          m_blocks(q_block_range(mask, n_block * Traits::kBlockN, Traits::kBlockM, Traits::kBlockN, binfo.seqlen_q)) {}

    __device__ int col0() const { return n_block * Traits::kBlockN; }
    __device__ bool has_work() const { return m_blocks.begin < m_blocks.end; }
};

}  // namespace flash::sm90
