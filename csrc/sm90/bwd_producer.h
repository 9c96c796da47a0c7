// The backward's load thread, for each of its block's tiles (bwd_block.h): K_j and V_j once
// (Algorithm 2 line 6), into the buffers the previous tile's consumers have released, then for
// each Q block that sees them Q_i with its log2-scaled logsumexp and dO_i with its D_i (line 8), by
// TMA into the stages the consumers have released.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/bwd_block.h"
#include "sm90/bwd_params.h"

namespace flash::sm90 {

using namespace cute;

template <class Traits, bool kIsCausal, bool kDynamicTiles>
__device__ __forceinline__ void bwd_producer(BwdKernelParams<Traits> const &kp, typename Traits::SharedStorage &shared,
                                             typename Traits::PipelineQ &pipeline_q,
                                             typename Traits::PipelineQ &pipeline_do) {
    using BlockM = typename Traits::BlockM;
    using BlockN = typename Traits::BlockN;
    using HeadDim = typename Traits::HeadDim;
    Flash_bwd_params const &params = kp.params;
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(shared.d_o.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutK{});
    auto q_state = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    auto do_state = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    int kv_loads = 0;

    SequenceTensorMaps<kBwdSequenceMaps> maps(kp.sequence_maps);
    const int num_tiles = bwd_num_tiles<Traits>(params);
    ProducerTiles<kDynamicTiles> tiles(shared.tile_ring, params.bwd_scratch, num_tiles);
    for (int64_t tile = tiles.first(); tile < num_tiles; tile = tiles.next()) {
        const BwdBlock<Traits, kIsCausal> block(params, int(tile));
        if (!block.has_work()) {
            tiles.claim();
            continue;  // no query sees these keys: the consumers write zeros
        }
        const int bidh_k = block.bidh / (params.num_heads / params.num_heads_k);
        const int q_start = maps.first_row(block.binfo.q_start), k_start = maps.first_row(block.binfo.k_start);
        Tensor gQ = local_tile(
            tma_sequence<true>(kp.tma_q.get_tma_tensor(kp.shape_q), kp.shape_q, q_start, block.bidh, block.bidb),
            Shape<BlockM, HeadDim>{}, make_coord(_, _0{}));  // (M, d, m_block)
        Tensor gdO = local_tile(
            tma_sequence<true>(kp.tma_do.get_tma_tensor(kp.shape_do), kp.shape_do, q_start, block.bidh, block.bidb),
            Shape<BlockM, HeadDim>{}, make_coord(_, _0{}));
        Tensor gK = local_tile(
            tma_sequence<true>(kp.tma_k.get_tma_tensor(kp.shape_k), kp.shape_k, k_start, bidh_k, block.bidb),
            Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));  // (N, d, n_block)
        Tensor gV = local_tile(
            tma_sequence<true>(kp.tma_v.get_tma_tensor(kp.shape_v), kp.shape_v, k_start, bidh_k, block.bidb),
            Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));
        auto [tQgQ, tQsQ] = tma_partition(kp.tma_q, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        auto [tdOgdO, tdOsdO] = tma_partition(kp.tma_do, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
        auto [tKgK, tKsK] = tma_partition(kp.tma_k, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
        auto [tVgV, tVsV] = tma_partition(kp.tma_v, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

        // Acquired before the wait for the previous tile's consumers, which then hides the fences.
        if (maps.per_sequence()) {
            maps.acquire(kBwdMapK, block.bidb);
            maps.acquire(kBwdMapV, block.bidb);
            maps.acquire(kBwdMapQ, block.bidb);
            maps.acquire(kBwdMapDo, block.bidb);
        }
        // The previous tile's consumers are done with its K and V (their dK and dV stores run
        // under this load).
        if (kv_loads > 0) {
            cutlass::arch::ClusterBarrier::wait(&shared.kv_empty, (kv_loads - 1) & 1);
        }
        ++kv_loads;
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&shared.kv_full, Traits::kKVBytes);
        copy(kp.tma_k.with(maps.get(kBwdMapK, block.bidb, kp.tma_k.get_tma_descriptor()), shared.kv_full),
             tKgK(_, block.n_block), tKsK(_, _0{}));
        copy(kp.tma_v.with(maps.get(kBwdMapV, block.bidb, kp.tma_v.get_tma_descriptor()), shared.kv_full),
             tVgV(_, block.n_block), tVsV(_, _0{}));

        // The row statistics of (batch, head), rows rounded up to the block (the preprocess wrote them).
        const int64_t stats_row0 = block.binfo.template accum_row0<Traits::kBlockM>(params, block.bidh);
        for (int m_block = block.m_blocks.begin; m_block < block.m_blocks.end; ++m_block) {
            const int64_t stats = stats_row0 + int64_t(m_block) * Traits::kBlockM;
            if (m_block + 1 == block.m_blocks.end) {
                tiles.claim();  // its latency hidden by the waits for the last Q and dO stages
            }
            pipeline_q.producer_acquire(q_state);
            uint64_t *q_full = pipeline_q.producer_get_barrier(q_state);
            copy(kp.tma_q.with(maps.get(kBwdMapQ, block.bidb, kp.tma_q.get_tma_descriptor()), *q_full), tQgQ(_, m_block),
                 tQsQ(_, q_state.index()));
            SM90_BULK_COPY_G2S::copy(params.softmax_lse_log2_ptr + stats, q_full,
                                     shared.lse_log2.data() + q_state.index() * Traits::kBlockM, Traits::kRowStatBytes);
            ++q_state;
            pipeline_do.producer_acquire(do_state);
            uint64_t *do_full = pipeline_do.producer_get_barrier(do_state);
            copy(kp.tma_do.with(maps.get(kBwdMapDo, block.bidb, kp.tma_do.get_tma_descriptor()), *do_full),
                 tdOgdO(_, m_block), tdOsdO(_, do_state.index()));
            SM90_BULK_COPY_G2S::copy(params.softmax_d_ptr + stats, do_full,
                                     shared.dot_do_o.data() + do_state.index() * Traits::kBlockM,
                                     Traits::kRowStatBytes);
            ++do_state;
        }
    }
}

}  // namespace flash::sm90
