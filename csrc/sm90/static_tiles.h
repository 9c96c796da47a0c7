// The static schedule of a persistent grid (the forward's non-causal tiles, tile_queue.h; the
// backward's persistent tiles, bwd_block.h). In round k the blocks take the indices [k G, k G + G)
// (G = gridDim.x), block b the one (b + k) mod G places past the round's first: every thread of a
// block computes the same sequence, nothing is shared. The rotation: both orders put a (batch,
// head)'s row or KV blocks side by side, so that where G and their count share a factor (132
// blocks, 11 row blocks of 2k rows; 8 KV blocks of 1k keys) a plain stride gave a block the same
// few of them in every round, and the lighter tiles at a window's, a causal diagonal's or a padded
// sequence's ends to the same blocks. A last round that is not full is not rotated, so that each of
// its indices is taken. With one block per tile (G = num_tiles) block b takes tile b alone.
#pragma once

#include <cstdint>

namespace flash::sm90 {

// The rotation is kept as a running slot, (blockIdx.x + round) mod G, so that no round divides.
struct StaticTiles {
    int64_t num_tiles;
    int64_t round_first = 0;
    int slot = 0;

    __device__ __forceinline__ int64_t first() {
        round_first = 0;
        slot = blockIdx.x;
        return current();
    }
    __device__ __forceinline__ int64_t next() {
        round_first += gridDim.x;
        slot = slot + 1 == int(gridDim.x) ? 0 : slot + 1;
        return current();
    }
    // The index next() will return.
    __device__ __forceinline__ int64_t peek() const {
        StaticTiles ahead = *this;
        return ahead.next();
    }
    __device__ __forceinline__ int64_t current() const {
        return round_first + (round_first + gridDim.x > num_tiles ? int(blockIdx.x) : slot);
    }
};

}  // namespace flash::sm90
