// Varlen forwards load V through the packed tensor's descriptor: the KV block that ends a sequence's
// keys inside it covers rows past them (the next sequence's, a KV cache's unwritten rows), which the
// TMA brings in as they are. P is 0 there, but 0 * NaN is NaN, so those rows of the block's V stage
// are set to zero before any P V reads it. (Padded problems need nothing: their descriptors end
// each sequence, and the TMA fills the rows past it with zeros.)
//
// The block's readers are the consumer warpgroups whose rows see it: those from some warpgroup up
// to the last with rows in the sequence (a row sees the sequence's last block if a row above it
// does), so the first of them zeroes the rows. Each of its threads arrives on v_tail_zeroed after
// its stores and the fence that makes them visible to the wgmma's reads (async proxy), and every
// reader, that one included, waits for the phase before its first P V: the warpgroups visit a
// tile's blocks from the last, so the block is each reader's first. One phase per tile whose block
// has readers (every warpgroup counts them alike); no warpgroup arrives for the next tile's phase
// before every reader has waited for this one's, since the GEMM turns (every warpgroup takes each
// of the tile's turns) hold the warpgroups within a tile of each other. Split-block kernels
// (fwd_split_blocks.h): warpgroup 0 takes the tile's first block, so it is the only reader.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "sm90/tile_work.h"

namespace flash::sm90 {

template <class Traits, bool kIsCausal>
struct VTail {
    TileWork<kIsCausal> const &work;

    // The block that ends the sequence's keys inside it, else -1.
    __device__ __forceinline__ int block() const {
        const int keys = work.binfo.seqlen_k;
        return work.binfo.varlen && keys % Traits::kBlockN != 0 ? keys / Traits::kBlockN : -1;
    }

    __device__ __forceinline__ bool seen_by(int warpgroup) const {
        const BlockRange own = work.template blocks_of_rows<Traits::kBlockN>(work.row0 + 64 * warpgroup, 64);
        return own.begin <= block() && block() < own.end;
    }

    // Warpgroup `warpgroup` reads the block; own: the KV blocks its rows see.
    __device__ __forceinline__ bool read_by(int warpgroup, BlockRange const &own) const {
        return (!Traits::kSplitBlocks || warpgroup == 0) && own.begin <= block() && block() < own.end;
    }

    // Some warpgroup reads the block: the last one with rows in the sequence does then.
    __device__ __forceinline__ bool has_readers() const {
        if constexpr (Traits::kSplitBlocks) {
            return seen_by(0);
        } else {
            const int last_row = min(work.row0 + Traits::kBlockM, work.binfo.seqlen_q) - 1;
            return block() >= 0 && last_row >= max(work.row0, 0) && seen_by((last_row - work.row0) / 64);
        }
    }

    // A reader, before its first P V of the tile; sVt: the block's V stage (d, keys), loaded.
    template <class SVt>
    __device__ __forceinline__ void zero_and_wait(SVt &&sVt, int warpgroup, uint64_t *zeroed, uint32_t phase,
                                                  int wtid) const {
        if (Traits::kSplitBlocks || warpgroup == 0 || !seen_by(warpgroup - 1)) {
            constexpr int kChunkElems = 16 / sizeof(typename Traits::Element);  // contiguous in the swizzle
            constexpr int kChunksPerRow = Traits::kHeadDim / kChunkElems;
            const int first_row = work.binfo.seqlen_k - block() * Traits::kBlockN;
            const int chunks = (Traits::kBlockN - first_row) * kChunksPerRow;
            for (int i = wtid; i < chunks; i += 128) {
                const int row = first_row + i / kChunksPerRow;
                *reinterpret_cast<uint4 *>(&sVt(i % kChunksPerRow * kChunkElems, row)) = make_uint4(0, 0, 0, 0);
            }
            cutlass::arch::fence_view_async_shared();
            cutlass::arch::ClusterBarrier::arrive(zeroed);
        }
        cutlass::arch::ClusterBarrier::wait(zeroed, phase);
    }
};

}  // namespace flash::sm90
