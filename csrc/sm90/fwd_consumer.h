// A consumer warpgroup's loop: for every tile, its 64 rows of Algorithm 1 (lines 5-13) with
// wgmma, then the epilogue (lines 14-15). Within a warpgroup, S = Q K_j^T and the previous block's
// O += P V are issued together; between the warpgroups, the GEMMs take turns (warpgroup_turns.h),
// so that one's softmax runs under the others' GEMMs.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/dropout.h"
#include "common/score_mod.h"
#include "common/softmax.h"
#include "sm90/dropout_mask.h"
#include "sm90/fwd_epilogue.h"
#include "sm90/fwd_params.h"
#include "sm90/fwd_split_blocks.h"
#include "sm90/tile_queue.h"
#include "sm90/tile_work.h"
#include "sm90/warpgroup_turns.h"
#include "sm90/warpgroup_vote.h"
#include "sm90/wgmma_utils.h"

namespace flash::sm90 {

using namespace cute;

// ctid: the thread's index among the consumer threads. kDropout (compiled with kScoreMod only, whose
// code then runs where the problem has a softcap or ALiBi): dropout on P~ (common/dropout.h).
template <class Traits, bool kIsCausal, bool kScoreMod, bool kDropout>
__device__ __forceinline__ void fwd_consumer(FwdKernelParams<Traits> const &kp,
                                             typename Traits::SharedStorage &shared,
                                             typename Traits::PipelineQ &pipeline_q,
                                             typename Traits::PipelineKV &pipeline_k,
                                             typename Traits::PipelineKV &pipeline_v, int ctid) {
    using Element = typename Traits::Element;
    using BlockM = typename Traits::BlockM;
    using BlockN = typename Traits::BlockN;
    using HeadDim = typename Traits::HeadDim;
    Flash_fwd_params const &params = kp.params;

    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutVt{});

    // Split-block kernels (fwd_split_blocks.h): both warpgroups compute warpgroup 0's rows.
    constexpr bool kSplit = Traits::kSplitBlocks;
    static_assert(!kSplit || !kDropout);
    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmaO mma_o;
    auto thr_mma_s = mma_s.get_thread_slice(kSplit ? ctid % 128 : ctid);
    auto thr_mma_o = mma_o.get_thread_slice(kSplit ? ctid % 128 : ctid);
    Tensor tSrQ = thr_mma_s.partition_fragment_A(sQ);   // (MMA, 1, MMA_K, stage) descriptors
    Tensor tSrK = thr_mma_s.partition_fragment_B(sK);   // (MMA, 1, MMA_K, stage)
    Tensor tOrVt = thr_mma_o.partition_fragment_B(sVt);  // (MMA, 1, MMA_K, stage)
    Tensor tScS = thr_mma_s.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{}));

    typename Traits::PipelineStateQ q_state;
    typename Traits::PipelineState k_state, v_state;
    // Among the consumer warpgroups; shuffled, so that ptxas knows it to be warp-uniform (the loops
    // over a warpgroup's own KV blocks then branch without divergence handling). The turns keep the
    // unshuffled index: their barrier ids from the shuffled one made ptxas reschedule d=64's softmax,
    // 3-4% slower (benchmarks/NOTES.md, run 188).
    const int warpgroup = __shfl_sync(0xffffffff, ctid / 128, 0);
    const WarpgroupTurns<Traits::kNumConsumerWarpgroups, uint32_t(FwdBarrier::kTurnOfWarpgroup0)> turns(ctid / 128);

    static_assert(!kDropout || kScoreMod);
    uint64_t seed = 0, offset = 0;
    if constexpr (kDropout) {
        dropout_seed_offset(params.philox, seed, offset);
        if (blockIdx.x == 0 && ctid == 0) {
            params.rng_state_ptr[0] = int64_t(seed);
            params.rng_state_ptr[1] = int64_t(offset);
        }
        // Read from memory under graph capture: shuffled, ptxas sees them as warp-uniform and keeps
        // Philox's round keys in uniform registers instead of recomputing them per call.
        seed = __shfl_sync(0xffffffff, seed, 0);
        offset = __shfl_sync(0xffffffff, offset, 0);
    }

    // Q's buffer of the previous tile, whose O this warpgroup's TMA store may still be reading
    // (two Q buffers): released once this tile's first S = Q K^T is issued, so that the wait for
    // the store overlaps that GEMM. The thread that issued the store waits for it. (One Q buffer:
    // released after the tile's last S, O going through a buffer of its own.)
    bool q_release_pending = false;
    typename Traits::PipelineStateQ pending_q_state;
    auto release_pending_q = [&]() __attribute__((always_inline)) {
        if (q_release_pending) {
            if (ctid % 128 == 0) {
                tma_store_wait<0>();
            }
            pipeline_q.consumer_release(pending_q_state);
            q_release_pending = false;
        }
    };

    int epilogues = 0;
    ConsumerTiles<Traits::kDynamicTiles> tiles(shared.tile_ring, kp.scheduler.num_tiles);
    for (int64_t tile = tiles.first(); tile < kp.scheduler.num_tiles; tile = tiles.next()) {
        const TileWork<kIsCausal> work = tile_work<Traits, kIsCausal>(kp, tile);
        if (work.empty()) {
            continue;
        }
        const TileCoord &tc = work.tc;
        const BlockInfo &binfo = work.binfo;
        const int row0 = work.row0;
        const Mask<kIsCausal> &mask = work.mask;
        const BlockRange &n_blocks = work.n_blocks;
        const ScoreMod score_mod(params, tc.bidb, tc.bidh, binfo.causal_shift());
        const DropoutRng dropout(params, seed, offset, tc.bidb, tc.bidh);
        // This warpgroup's 64 rows and the KV blocks they see, which it visits from the last to the
        // first: runs of blocks that need a mask (the seqlen_k edge and the window's right edge, i.e.
        // the causal diagonal, first; the window's left edge last) alternate with runs that need
        // none, whose loop has no mask code. The tile's other blocks it passes (pass_block).
        const int wg_row0 = row0 + (kSplit ? 0 : 64 * warpgroup);
        const BlockRange own_blocks = work.template blocks_of_rows<Traits::kBlockN>(wg_row0, 64);
        auto needs_mask = [&](int n_block) __attribute__((always_inline)) {
            return mask.needed(wg_row0, n_block * Traits::kBlockN, 64, Traits::kBlockN);
        };

        // Line 5: O = 0, l = 0, m = -inf.
        Tensor acc_o = partition_fragment_C(mma_o, Shape<BlockM, HeadDim>{});
        clear(acc_o);
        Tensor acc_o_rows = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
        constexpr int kRows = decltype(size<0>(acc_o_rows))::value;
        OnlineSoftmax<kRows> softmax;
        Tensor acc_s = partition_fragment_C(mma_s, Shape<BlockM, BlockN>{});
        Tensor acc_s_rows = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
        Tensor p = make_tensor<Element>(acc_s.layout());  // P~ in 16 bits, the A of O += P V
        Tensor tOrP = make_tensor(p.data(), acc_as_operand_a(p.layout()));
        // The softmax's rescale of O, e^{m_old - m} per row: update() scales this (rows, 1) tensor
        // of ones instead of O, which a P V GEMM may still be writing; o_rescaled says whether it
        // moved any row's max (the lazy max of common/softmax.h: mostly not, past the first blocks).
        Tensor rescale = make_tensor<float>(Shape<Int<kRows>, _1>{});
        bool o_rescaled = false;
        // Dropout's masks of the last softmax step, applied to P~ once it is converted.
        DropoutHalves<decltype(size(acc_s))::value / 2> dropout_halves_of_p;

        pipeline_q.consumer_wait(q_state);
        Tensor tSrQ_tile = tSrQ(_, _, _, q_state.index());

        // The lambdas are forced inline (as are all device functions here): a call between a
        // wgmma's issue and its wait makes ptxas wait for the wgmma before the call.

        const float scale_log2 = kScoreMod ? score_mod.score_scale_log2 : params.softmax_scale_log2;
        // Lines 9-10 up to P~: mask, online softmax, P~ = exp(S - m), and dropout's masks (dropout acts
        // on the normalized P: the row sums are of P~ before it).
        auto scores_of_block = [&](int n_block, auto masked) __attribute__((always_inline)) {
            if constexpr (kScoreMod) {
                score_mod.apply(acc_s, tScS, row0, n_block * Traits::kBlockN);
            }
            if constexpr (decltype(masked)::value) {
                const int col0 = n_block * Traits::kBlockN;
                mask.apply(acc_s, tScS, row0, col0, mask.edges(wg_row0, col0, 64, Traits::kBlockN));
            }
        };
        auto dropout_masks = [&](int n_block) __attribute__((always_inline)) {
            if constexpr (kDropout) {
                dropout_halves_of_p = dropout_halves(dropout, tScS, row0, n_block * Traits::kBlockN);
            }
        };
        // lazy_max false: the rows take the block's max whatever the lag (OnlineSoftmax::update).
        auto softmax_step = [&](int n_block, auto masked, auto lazy_max) __attribute__((always_inline)) {
            scores_of_block(n_block, masked);
            fill(rescale, 1.f);
            o_rescaled = softmax.template update<decltype(lazy_max)::value>(acc_s_rows, rescale, scale_log2);
            dropout_masks(n_block);
        };
        // The same at the rows' current max (OnlineSoftmax::exp_at_current_max), which holds for nearly
        // every block once the rows have seen a whole unmasked block (max_settled). Where some thread of
        // the warpgroup has a row that outgrows it (or has seen no key yet), returns true: S is then
        // computed again and softmax_step() takes the new max, in every warp (the GEMM is the warpgroup's).
        // At d <= 192 in the plain kernel and in the causal score-mod kernel where the problem has no
        // softcap (at_current_max): at d = 256 (64-key blocks, where the row max is a smaller share of a
        // step and K's later release counts more: ~1.5% at 16k, run 353) the steps ran 1-2% faster up to 2k
        // keys and 2% slower at 16k (run 351); the dropout kernel's redo spills at d=128 (44 bytes) and
        // fits at d=64, where the steps at the current max were 4-8% slower (run 305); softcap's step waits
        // on its MUFU operations (tanh and exp2), under which the row max's FMNMX ran for free (run 248:
        // 2-4% slower at d=64 with the vote); ALiBi's bias grows towards each row's diagonal, so where rows
        // see keys right of it the blocks, visited from the last, bring a higher max each, and the
        // non-causal score-mod kernel with the code of the steps ran those problems on the exact max 2-5%
        // slower (run 250).
        constexpr bool kAtCurrentMax = (!kScoreMod || (kIsCausal && !kDropout)) && Traits::kHeadDim <= 192;
        const bool at_current_max = kAtCurrentMax && !(kScoreMod && score_mod.softcapped());
        bool max_settled = false;
        auto softmax_step_at_current_max = [&](int n_block, auto masked) __attribute__((always_inline)) {
            scores_of_block(n_block, masked);
            const bool within = softmax.exp_at_current_max(acc_s_rows, scale_log2);
            const bool redo = warpgroup_any(!within, uint32_t(FwdBarrier::kOwnOfWarpgroup0) + warpgroup);
            if (!redo) {
                softmax.commit_pending();
                o_rescaled = false;
            }
            return redo;
        };
        // P~ in 16 bits for O += P V, with dropout's zeros.
        auto convert_p = [&]() __attribute__((always_inline)) {
            convert(acc_s, p);
            if constexpr (kDropout) {
                apply_dropout(dropout, dropout_halves_of_p, p);
            }
        };

        // O *= e^{m_old - m} for the last softmax step, just before the next P V adds to O.
        auto rescale_o = [&]() __attribute__((always_inline)) {
            if (!o_rescaled) {
                return;
            }
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r) {
                CUTE_UNROLL
                for (int c = 0; c < size<1>(acc_o_rows); ++c) {
                    acc_o_rows(r, c) *= rescale(r, 0);
                }
            }
        };

        // Split-block kernels: the partner's block that this warpgroup passed while its own V was still
        // to be read by a P V, released after that V (each pipeline's buffers are released in order).
        [[maybe_unused]] bool deferred_v = false;
        auto release_own_v = [&]() __attribute__((always_inline)) {
            pipeline_v.consumer_release(v_state);
            ++v_state;
            if constexpr (kSplit) {
                if (deferred_v) {
                    pipeline_v.consumer_wait(v_state);
                    pipeline_v.consumer_release(v_state);
                    ++v_state;
                    deferred_v = false;
                }
            }
        };

        // One KV block: line 8 for it issued with line 10 for the previous block, and its softmax
        // between the waits for the two, so that it runs under P V.
        auto kv_step = [&](int n_block, auto masked) __attribute__((always_inline)) {
            pipeline_k.consumer_wait(k_state);
            turns.wait();
            wgmma_gemm</*kZeroInit=*/true>(mma_s, tSrQ_tile, tSrK(_, _, _, k_state.index()), acc_s);
            rescale_o();
            pipeline_v.consumer_wait(v_state);
            warpgroup_fence_operand(p);
            wgmma_gemm</*kZeroInit=*/false>(mma_o, tOrP, tOrVt(_, _, _, v_state.index()), acc_o);
            turns.pass();
            warpgroup_wait<1>();
            warpgroup_fence_operand(acc_s);
            [[maybe_unused]] bool redo = false;
            if constexpr (kAtCurrentMax) {
                if (at_current_max && max_settled) {
                    redo = softmax_step_at_current_max(n_block, masked);
                } else {
                    softmax_step(n_block, masked, cute::true_type{});
                    max_settled = !decltype(masked)::value;
                }
            } else {
                pipeline_k.consumer_release(k_state);
                ++k_state;
                softmax_step(n_block, masked, cute::true_type{});
            }
            wait_below(softmax.row_sum, &shared.softmax_fence[ctid]);
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc_o);
            warpgroup_fence_operand(p);
            release_own_v();
            // With a redo, K is released after the softmax (no later for the loads: the producer
            // issues K_{j+2} behind V_{j+1}, which waits for V_{j-1}'s release above).
            if constexpr (kAtCurrentMax) {
                if (redo) {
                    wgmma_gemm</*kZeroInit=*/true>(mma_s, tSrQ_tile, tSrK(_, _, _, k_state.index()), acc_s);
                    warpgroup_wait<0>();
                    warpgroup_fence_operand(acc_s);
                    softmax_step(n_block, masked, cute::false_type{});
                }
                pipeline_k.consumer_release(k_state);
                ++k_state;
            }
            convert_p();
        };

        // A block of the tile that none of this warpgroup's rows sees: its turn passes without a
        // GEMM (the turns stay in step), its K and V buffers are released once loaded (a release
        // before the load would count towards the buffer's previous use).
        auto pass_block = [&]() __attribute__((always_inline)) {
            turns.skip();
            pipeline_k.consumer_wait(k_state);
            pipeline_k.consumer_release(k_state);
            ++k_state;
            pipeline_v.consumer_wait(v_state);
            pipeline_v.consumer_release(v_state);
            ++v_state;
        };

        int n_block = n_blocks.end - 1;
        // Split-block kernels: from this warpgroup's own block to its next one, passing the partner's
        // between them (K now, V once this warpgroup's own V is released).
        auto next_own_block = [&]() __attribute__((always_inline)) {
            --n_block;
            if constexpr (kSplit) {
                if (n_block >= own_blocks.begin) {
                    turns.skip();
                    pipeline_k.consumer_wait(k_state);
                    pipeline_k.consumer_release(k_state);
                    ++k_state;
                    deferred_v = true;
                    --n_block;
                }
            }
        };

        for (; n_block >= own_blocks.end; --n_block) {
            pass_block();
        }
        if constexpr (kSplit) {
            if (warpgroup == 1 && n_block >= own_blocks.begin) {  // warpgroup 0 takes the first block
                pass_block();
                --n_block;
            }
        }
        if (n_block >= own_blocks.begin) {
            // Line 8 for the first block, and its softmax (O is still 0: nothing to rescale).
            pipeline_k.consumer_wait(k_state);
            turns.wait();
            wgmma_gemm</*kZeroInit=*/true>(mma_s, tSrQ_tile, tSrK(_, _, _, k_state.index()), acc_s);
            turns.pass();
            release_pending_q();
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc_s);
            pipeline_k.consumer_release(k_state);
            ++k_state;
            if (needs_mask(n_block)) {
                softmax_step(n_block, cute::true_type{}, cute::true_type{});
            } else {
                softmax_step(n_block, cute::false_type{}, cute::true_type{});
                max_settled = true;
            }
            if constexpr (kSplit) {
                const int keys_in_block = binfo.seqlen_k - n_block * Traits::kBlockN;
                if (keys_in_block < Traits::kBlockN) {
                    pipeline_v.consumer_wait(v_state);
                    zero_v_rows_past_keys<Traits>(sVt(_, _, v_state.index()), keys_in_block, ctid % 128,
                                                  uint32_t(FwdBarrier::kOwnOfWarpgroup0) + warpgroup);
                }
            }
            convert_p();

            for (next_own_block(); n_block >= own_blocks.begin;) {
                for (; n_block >= own_blocks.begin && needs_mask(n_block); next_own_block()) {
                    kv_step(n_block, cute::true_type{});
                }
                for (; n_block >= own_blocks.begin && !needs_mask(n_block); next_own_block()) {
                    kv_step(n_block, cute::false_type{});
                }
            }

            if constexpr (Traits::kOBuffer) {
                pipeline_q.consumer_release(q_state);  // its last S has been waited for
            }
            // Line 10 for the last block.
            pipeline_v.consumer_wait(v_state);
            turns.wait();
            rescale_o();
            warpgroup_fence_operand(p);
            wgmma_gemm</*kZeroInit=*/false>(mma_o, tOrP, tOrVt(_, _, _, v_state.index()), acc_o);
            turns.pass();
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc_o);
            release_own_v();
        } else {
            if constexpr (Traits::kOBuffer) {
                pipeline_q.consumer_release(q_state);
            }
            if (n_blocks.begin < n_blocks.end) {
                turns.skip();  // the turn of the last block's P V
            }
        }
        for (; n_block >= n_blocks.begin; --n_block) {
            pass_block();
        }

        if constexpr (kSplit) {
            // Warpgroup 1's rows are warpgroup 0's, which stores them.
            exchange_partials<Traits>(shared, q_state.index(), softmax, acc_o_rows, warpgroup, ctid % 128, scale_log2);
        }
        if (!kSplit || warpgroup == 0) {
            // Lines 12-13.
            auto lse = softmax.finalize(acc_o_rows, kScoreMod ? score_mod.score_scale : params.softmax_scale,
                                        kDropout ? params.dropout_scale : 1.f);
            release_pending_q();  // a tile without KV blocks issues no S
            fwd_epilogue<Traits>(kp, shared, binfo, tc, row0, acc_o, lse, thr_mma_o, ctid, q_state.index(),
                                 /*o_buffer_first=*/warpgroup == 0 && epilogues == 0,
                                 /*o_phase=*/(warpgroup == 0 ? epilogues - 1 : epilogues) & 1);
            ++epilogues;
        } else {
            release_pending_q();
        }
        if constexpr (Traits::kQStages > 1) {
            q_release_pending = true;
            pending_q_state = q_state;
        }
        ++q_state;
    }
    // The last O store has read its shared memory before the block exits.
    if (ctid % 128 == 0) {
        tma_store_wait<0>();
    }
}

}  // namespace flash::sm90
