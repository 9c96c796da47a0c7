// The persistent grid's tile order: tile index -> (row block, head, batch). Which block takes
// which index: tile_queue.h.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/fast_divmod.h"

namespace flash::sm90 {

struct TileCoord {
    int m_block, bidh, bidb;
};

// The divisions by the grid's sizes go through multipliers computed on the host
// (common/fast_divmod.h): every warp of a block decodes every tile. Tile indices fit in 31 bits
// (tile_indices_fit; larger grids run on the FA2 family, sm90/family.cpp).
struct TileScheduler {
    int64_t num_tiles;    // num_m_blocks * num_heads * batch
    FastDivmod m_blocks;  // num_m_blocks (1 for an empty grid, which decodes no tile)
    FastDivmod heads;     // num_heads
    // Causal: the (batch, head) pairs are taken in groups whose K and V fit in L2 together: the
    // first num_big_groups groups hold group_size + 1 pairs, the others group_size.
    int big_pairs;  // the pairs of the big groups
    int big_tiles;  // and their tiles
    FastDivmod big_group, group;              // group_size + 1, group_size
    FastDivmod big_group_tiles, group_tiles;  // times num_m_blocks

    // Non-causal: a (batch, head)'s row blocks are adjacent, so that the blocks running together
    // share its K and V in L2. Causal: within a group of (batch, head) pairs, the row blocks go
    // from the last (which see the most keys) to the first, the pairs of the group interleaved:
    // the heavy tiles start early, and the short ones fill in the tail of each group.
    template <bool kIsCausal>
    __host__ __device__ __forceinline__ TileCoord coord(int64_t tile_index) const {
        const int tile = int(tile_index);
        int m, bh;
        if constexpr (kIsCausal) {
            const bool big = tile < big_tiles;
            int g, r, q;
            (big ? big_group_tiles : group_tiles)(g, r, big ? tile : tile - big_tiles);
            (big ? big_group : group)(q, bh, r);
            bh += big ? g * big_group.divisor : big_pairs + g * group.divisor;
            m = m_blocks.divisor - 1 - q;
        } else {
            m_blocks(bh, m, tile);
        }
        int bidb, bidh;
        heads(bidb, bidh, bh);
        return {m, bidh, bidb};
    }
};

// Whether make_tile_scheduler's sizes fit in 31 bits for this grid: the tile indices, and the
// tiles of a group of all the (batch, head) pairs plus one.
inline bool tile_indices_fit(int num_m_blocks, int num_heads, int batch) {
    return int64_t(num_m_blocks) * (int64_t(num_heads) * batch + 1) <= INT32_MAX;
}

// Groups of about l2_budget_bytes of K and V (kv_bytes_per_pair each), in balanced sizes.
inline TileScheduler make_tile_scheduler(int num_m_blocks, int num_heads, int batch, int64_t kv_bytes_per_pair,
                                         int64_t l2_budget_bytes) {
    const int64_t num_bh = int64_t(num_heads) * batch;
    const int64_t pairs_per_group = std::max<int64_t>(1, l2_budget_bytes / std::max<int64_t>(1, kv_bytes_per_pair));
    const int64_t num_groups = std::max<int64_t>(1, (num_bh + pairs_per_group - 1) / pairs_per_group);
    // At least 1 where the grid is empty (no division by zero in the multipliers).
    const int m = std::max(1, num_m_blocks);
    const int group_size = int(std::max<int64_t>(1, num_bh / num_groups));
    const int num_big_groups = int(num_bh % num_groups);
    return {int64_t(num_m_blocks) * num_bh,
            FastDivmod(m),
            FastDivmod(std::max(1, num_heads)),
            num_big_groups * (group_size + 1),
            num_big_groups * (group_size + 1) * num_m_blocks,
            FastDivmod(group_size + 1),
            FastDivmod(group_size),
            FastDivmod((group_size + 1) * m),
            FastDivmod(group_size * m)};
}

}  // namespace flash::sm90
