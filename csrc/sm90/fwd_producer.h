// The load warp's loop: for every tile, Q once (Algorithm 1 line 4) and K_j, V_j for each KV block
// the tile visits (line 7), by TMA into the shared-memory stages the consumers have released.
// Run by one thread.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/fwd_params.h"
#include "sm90/paged_keys.h"
#include "sm90/sequence_tensor_maps.h"
#include "sm90/tile_queue.h"
#include "sm90/tile_work.h"

namespace flash::sm90 {

using namespace cute;

// Where one KV block comes from: K's TMA tile, V's, and whether V loads through its sequence's
// descriptor (sequence_tensor_maps.h; acquired just before the load, behind K's) or the packed one.
struct BlockLoad {
    int k_tile, v_tile;
    bool v_own_map;
};

template <class Traits, bool kIsCausal>
__device__ __forceinline__ void fwd_producer(FwdKernelParams<Traits> const &kp,
                                             typename Traits::SharedStorage &shared,
                                             typename Traits::PipelineQ &pipeline_q,
                                             typename Traits::PipelineKV &pipeline_k,
                                             typename Traits::PipelineKV &pipeline_v) {
    using BlockM = typename Traits::BlockM;
    using BlockN = typename Traits::BlockN;
    using HeadDim = typename Traits::HeadDim;
    Flash_fwd_params const &params = kp.params;

    cute::prefetch_tma_descriptor(kp.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(kp.tma_v.get_tma_descriptor());

    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutVt{});
    Tensor mQ = kp.tma_q.get_tma_tensor(kp.shape_q);  // (rows, d, heads, batch)
    Tensor mK = kp.tma_k.get_tma_tensor(kp.shape_k);
    Tensor mVt = kp.tma_v.get_tma_tensor(kp.shape_v);  // (d, rows, heads, batch)

    auto q_state = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    auto k_state = cutlass::make_producer_start_state<typename Traits::PipelineKV>();
    auto v_state = cutlass::make_producer_start_state<typename Traits::PipelineKV>();

    SequenceTensorMaps<kFwdSequenceMaps> maps(kp.sequence_maps);
    ProducerTiles<Traits::kDynamicTiles> tiles(shared.tile_ring, params.fwd_workspace, kp.scheduler.num_tiles);
    for (int64_t tile = tiles.first(); tile < kp.scheduler.num_tiles; tile = tiles.next()) {
        const TileWork<kIsCausal> work = tile_work<Traits, kIsCausal>(kp, tile);
        if (work.empty()) {
            tiles.claim();
            continue;
        }
        const TileCoord &tc = work.tc;
        const BlockInfo &binfo = work.binfo;
        const BlockRange &n_blocks = work.n_blocks;
        const int bidh_k = tc.bidh / (params.num_heads / params.num_heads_k);

        // Paged K and V are tiled from the pages' first row (and the last page's descriptor from its
        // own), a block's tile found through the block table.
        const PagedKeys pages(params, binfo.k_start);
        Tensor gQ = local_tile(tma_sequence<true>(mQ, kp.shape_q, binfo.q_start + work.row0, tc.bidh, tc.bidb),
                               Shape<BlockM, HeadDim>{}, make_coord(_0{}, _0{}));
        Tensor gK = local_tile(tma_sequence<true>(mK, kp.shape_k, pages.paged() ? 0 : binfo.k_start, bidh_k, tc.bidb),
                               Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));  // (N, d, n_block)
        Tensor gVt = local_tile(tma_sequence<false>(mVt, kp.shape_v, pages.paged() ? 0 : maps.first_row(binfo.k_start),
                                                    bidh_k, tc.bidb),
                                Shape<HeadDim, BlockN>{}, make_coord(_0{}, _));  // (d, N, n_block)
        // (TMA[, n_block]) and (TMA, stage); not structured bindings, which lambdas cannot capture in C++17.
        auto tQgQ_tQsQ = tma_partition(kp.tma_q, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        auto tKgK_tKsK = tma_partition(kp.tma_k, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto tVgV_tVsV = tma_partition(kp.tma_v, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
        Tensor tQgQ = get<0>(tQgQ_tQsQ);
        Tensor tQsQ = get<1>(tQgQ_tQsQ);
        Tensor tKgK = get<0>(tKgK_tKsK);
        Tensor tKsK = get<1>(tKgK_tKsK);
        Tensor tVgV = get<0>(tVgV_tVsV);
        Tensor tVsV = get<1>(tVgV_tVsV);

        auto load_q = [&]() __attribute__((always_inline)) {
            pipeline_q.producer_acquire(q_state);
            copy(kp.tma_q.with(*pipeline_q.producer_get_barrier(q_state)), tQgQ, tQsQ(_, q_state.index()));
            ++q_state;
        };
        auto load_k = [&](BlockLoad const &b) __attribute__((always_inline)) {
            pipeline_k.producer_acquire(k_state);
            copy(kp.tma_k.with(*pipeline_k.producer_get_barrier(k_state)), tKgK(_, b.k_tile), tKsK(_, k_state.index()));
            ++k_state;
        };
        auto load_v = [&](BlockLoad const &b) __attribute__((always_inline)) {
            TmaDescriptor const *v_map = kp.tma_v.get_tma_descriptor();
            if (b.v_own_map) {
                v_map = maps.get(kFwdMapV, tc.bidb, v_map);
            }
            pipeline_v.producer_acquire(v_state);
            copy(kp.tma_v.with(v_map, *pipeline_v.producer_get_barrier(v_state)), tVgV(_, b.v_tile),
                 tVsV(_, v_state.index()));
            ++v_state;
        };

        // Blocks in the consumers' order, last to first. With two Q buffers, Q goes out first: its
        // buffer was freed by the tile before last. With one, the first K goes out before Q, which
        // waits until the previous tile's last S = Q K^T is done. The next tile is claimed just
        // before the last block's loads (before Q's without a block): the waits for their stages
        // hide the atomic's latency. A block's coordinates are worked out before the waits for its
        // stages, so that a released stage is refilled at once; paged, from the block's entry of
        // the block table, loaded a block earlier (the two kinds of cache in loops of their own: a
        // decoding tile's loads are bound by this one thread's latency).
        auto load_blocks = [&](auto paged) __attribute__((always_inline)) {
            constexpr bool kPaged = decltype(paged)::value;
            auto entry = [&](int n_block) {
                return kPaged && n_block >= n_blocks.begin ? pages.entry(n_block * Traits::kBlockN) : 0;
            };
            auto block_load = [&](int n_block, int block_entry) {
                if constexpr (!kPaged) {
                    return BlockLoad{n_block, n_block, true};
                } else {
                    const int key = n_block * Traits::kBlockN;
                    const int k_tile = pages.row(key, block_entry) / Traits::kBlockN;
                    if (key + Traits::kBlockN <= binfo.seqlen_k || !maps.per_sequence()) {
                        return BlockLoad{k_tile, k_tile, false};
                    }
                    // Past the keys: V from the last page's own descriptor, which fills zeros (the
                    // split-block kernels have none and zero those rows themselves).
                    return BlockLoad{k_tile, (key - pages.tail_key(binfo.seqlen_k)) / Traits::kBlockN, true};
                }
            };
            int n_block = n_blocks.end - 1;
            const int last_entry = entry(n_block);
            int entry_ahead = entry(n_block - 1);
            if (n_block <= n_blocks.begin) {
                tiles.claim();
            }
            if constexpr (Traits::kQStages > 1) {
                load_q();
            }
            const BlockLoad last = block_load(n_block, last_entry);
            if (n_block >= n_blocks.begin) {
                load_k(last);
            }
            if constexpr (Traits::kQStages == 1) {
                load_q();
            }
            if (n_block >= n_blocks.begin) {
                load_v(last);
            }
            for (--n_block; n_block >= n_blocks.begin; --n_block) {
                if (n_block == n_blocks.begin) {
                    tiles.claim();
                }
                const BlockLoad block = block_load(n_block, entry_ahead);
                entry_ahead = entry(n_block - 1);
                load_k(block);
                load_v(block);
            }
        };
        if (__builtin_expect(pages.paged(), false)) {
            load_blocks(cute::true_type{});
        } else {
            load_blocks(cute::false_type{});
        }
        // The next tile's V descriptor, while the consumers work through this tile's last blocks: at
        // its start, a tile of one KV block would wait for the fence (run 294: +4-31% on 256
        // sequences of 64 rows, against +4-9% this way, run 295).
        if (maps.per_sequence()) {
            const int64_t upcoming = tiles.peek();
            if (upcoming < kp.scheduler.num_tiles) {
                maps.acquire(kFwdMapV, kp.scheduler.template coord<kIsCausal>(upcoming).bidb);
            }
        }
    }
}

}  // namespace flash::sm90
