// The persistent grid's tile order: tile index -> (row block, head, batch). Which block takes
// which index: tile_queue.h.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flash::sm90 {

struct TileCoord {
    int m_block, bidh, bidb;
};

struct TileScheduler {
    int num_m_blocks;
    int num_heads;
    int64_t num_tiles;  // num_m_blocks * num_heads * batch
    // Causal: the (batch, head) pairs are taken in groups whose K and V fit in L2 together: the
    // first num_big_groups groups hold group_size + 1 pairs, the others group_size.
    int64_t group_size;
    int64_t num_big_groups;

    // Non-causal: a (batch, head)'s row blocks are adjacent, so that the blocks running together
    // share its K and V in L2. Causal: within a group of (batch, head) pairs, the row blocks go
    // from the last (which see the most keys) to the first, the pairs of the group interleaved:
    // the heavy tiles start early, and the short ones fill in the tail of each group.
    template <bool kIsCausal>
    __host__ __device__ __forceinline__ TileCoord coord(int64_t tile) const {
        int m;
        int64_t bh;
        if constexpr (kIsCausal) {
            const int64_t big_tiles = num_big_groups * (group_size + 1) * num_m_blocks;
            int64_t first_bh, r, size;
            if (tile < big_tiles) {
                size = group_size + 1;
                const int64_t g = tile / (size * num_m_blocks);
                first_bh = g * size;
                r = tile - g * size * num_m_blocks;
            } else {
                size = group_size;
                const int64_t g = (tile - big_tiles) / (size * num_m_blocks);
                first_bh = num_big_groups * (group_size + 1) + g * size;
                r = tile - big_tiles - g * size * num_m_blocks;
            }
            m = num_m_blocks - 1 - int(r / size);
            bh = first_bh + r % size;
        } else {
            m = int(tile % num_m_blocks);
            bh = tile / num_m_blocks;
        }
        return {m, int(bh % num_heads), int(bh / num_heads)};
    }
};

// Groups of about l2_budget_bytes of K and V (kv_bytes_per_pair each), in balanced sizes.
inline TileScheduler make_tile_scheduler(int num_m_blocks, int num_heads, int batch, int64_t kv_bytes_per_pair,
                                         int64_t l2_budget_bytes) {
    const int64_t num_bh = int64_t(num_heads) * batch;
    const int64_t pairs_per_group = std::max<int64_t>(1, l2_budget_bytes / std::max<int64_t>(1, kv_bytes_per_pair));
    const int64_t num_groups = std::max<int64_t>(1, (num_bh + pairs_per_group - 1) / pairs_per_group);
    return {num_m_blocks, num_heads, int64_t(num_m_blocks) * num_bh, num_bh / num_groups, num_bh % num_groups};
}

}  // namespace flash::sm90
