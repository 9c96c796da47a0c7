// Split-block tiles (FwdKernelTraits::kSplitBlocks). Where a tile's rows fit in 64 (decoding: a few
// query rows against many keys), one warpgroup would run the tile's whole chain of S GEMM, softmax
// and P V per KV block while the other passes every block. In these kernels both compute warpgroup
// 0's rows, each over every other block of the tile, and the blocks are narrower and come through
// more stages (fwd_tile_config.h), so that the loads run further ahead; at the tile's end warpgroup
// 1 hands its partial O (not normalized, fp32), row maxima and partial row sums over to warpgroup
// 0, which merges them into its own (Algorithm 1's statistics of two sets of keys, as split-KV
// combines them) before its epilogue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/softmax.h"
#include "sm90/fwd_kernel_traits.h"

namespace flash::sm90 {

// These kernels load V through the packed tensor's descriptor (no per-sequence one, sequence_tensor_maps.h):
// the KV block that ends a sequence's keys covers rows past them (the next sequence's, a cache's
// unwritten rows), which the TMA brings in as they are. P is 0 there, but 0 * NaN is NaN, so the
// warpgroup that reads the block (the only one: each reads its own blocks) sets those rows of the V
// stage (sVt: (d, keys)) to zero before its P V, rows first_row up to the block's end. The zeros are
// generic-proxy stores, made visible to the wgmma's reads (async proxy) by each thread's fence and
// the warpgroup's barrier.
template <class Traits, class SVt>
__device__ __forceinline__ void zero_v_rows_past_keys(SVt &&sVt, int first_row, int wtid, uint32_t barrier) {
    constexpr int kChunkElems = 16 / sizeof(typename Traits::Element);  // a 16-byte store's, contiguous in the swizzle
    constexpr int kChunksPerRow = Traits::kHeadDim / kChunkElems;
    const int chunks = (Traits::kBlockN - first_row) * kChunksPerRow;
    for (int i = wtid; i < chunks; i += 128) {
        const int row = first_row + i / kChunksPerRow;
        *reinterpret_cast<uint4 *>(&sVt(i % kChunksPerRow * kChunkElems, row)) = make_uint4(0, 0, 0, 0);
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, barrier);
}

// The tile's Q buffer as fp32: thread t's i-th value at i * 128 + t (no bank conflicts). It is free
// once both warpgroups' GEMMs of the tile are done, until warpgroup 0 stores O through it.
template <class Traits>
__device__ __forceinline__ float *split_partials(typename Traits::SharedStorage &shared, int q_stage) {
    constexpr int kStageElems = cute::cosize_v<typename Traits::SmemLayoutQ> / Traits::kQStages;
    static_assert(kStageElems == Traits::kBlockM * Traits::kHeadDim);
    return reinterpret_cast<float *>(shared.q.data() + q_stage * kStageElems);
}

// The weight of a half's statistics at the merged row max m (raw scores; 0 for a half that saw no key).
__device__ __forceinline__ float split_weight(float half_max, float m, float scale_log2) {
    return half_max == -INFINITY ? 0.f : exp2f((half_max - m) * scale_log2);
}

// Both warpgroups, after their last GEMM of the tile (wtid: the thread's index in its warpgroup; o:
// the (rows, cols) view of its O accumulator): warpgroup 1 writes its partials, warpgroup 0 merges
// them into softmax and o (thread t's rows are warpgroup 1's thread t's). Both pass each barrier
// through one and the same bar.sync: an arrive on one side would do under the memory model, but
// racecheck reports the hand-over then (run 377), and synccheck reports two bar.sync instructions
// on one barrier (run 378); the waits cost nothing here (warpgroup 0 waits for the partials anyway).
template <class Traits, int kRows, class O>
__device__ __forceinline__ void exchange_partials(typename Traits::SharedStorage &shared, int q_stage,
                                                  OnlineSoftmax<kRows> &softmax, O &o, int warpgroup, int wtid,
                                                  float scale_log2) {
    static_assert(kRows == 2 && decltype(cute::size(o))::value * 128 * sizeof(float) <=
                                    Traits::kBlockM * Traits::kHeadDim * sizeof(typename Traits::Element));
    float *partials = split_partials<Traits>(shared, q_stage);
    constexpr int kCols = decltype(cute::size<1>(o))::value;
    // Warpgroup 0's S GEMMs read the buffer until then.
    cutlass::arch::NamedBarrier::sync(256, uint32_t(FwdBarrier::kSplitGemmsDone));
    if (warpgroup == 1) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            shared.split_stats.row_max[r][wtid] = softmax.row_max(r);
            shared.split_stats.row_sum[r][wtid] = softmax.row_sum(r);
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
                partials[(r * kCols + c) * 128 + wtid] = o(r, c);
            }
        }
        // A later tile's Q arrives in this buffer by TMA (async proxy), after these generic-proxy writes.
        cutlass::arch::fence_view_async_shared();
    }
    cutlass::arch::NamedBarrier::sync(256, uint32_t(FwdBarrier::kSplitPartialsReady));
    if (warpgroup == 0) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const float other_max = shared.split_stats.row_max[r][wtid];
            const float m = fmaxf(softmax.row_max(r), other_max);
            const float own_weight = split_weight(softmax.row_max(r), m, scale_log2);
            const float other_weight = split_weight(other_max, m, scale_log2);
            softmax.row_max(r) = m;
            softmax.row_sum(r) = softmax.row_sum(r) * own_weight + shared.split_stats.row_sum[r][wtid] * other_weight;
            CUTE_UNROLL
            for (int c = 0; c < kCols; ++c) {
                o(r, c) = o(r, c) * own_weight + partials[(r * kCols + c) * 128 + wtid] * other_weight;
            }
        }
        // The whole warpgroup has read the buffer before any thread's epilogue writes O into it.
        cutlass::arch::NamedBarrier::sync(128, uint32_t(FwdBarrier::kOwnOfWarpgroup0));
    }
}

}  // namespace flash::sm90
