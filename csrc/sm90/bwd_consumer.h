// A consumer warpgroup of the Hopper backward: for each Q block that sees the block's keys,
// Algorithm 2 lines 9-19 on its 64 keys, transposed (bwd_kernel_traits.h): S^T and dP^T by wgmma,
// P^T and dS^T in registers, dV and dK (its columns of them) accumulated in registers, dQ's partial
// sum over the block's keys added to the fp32 accumulator in global memory (bwd_dq.h). Then dK and
// dV out (line 21). kVariants: softcap, ALiBi and dropout, each where the problem has it;
// kDeterministic: dQ's adds in a fixed order (bwd_dq.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/dropout.h"
#include "common/score_mod.h"
#include "sm90/bwd_block.h"
#include "sm90/bwd_dq.h"
#include "sm90/bwd_dropout.h"
#include "sm90/bwd_key_rows_out.h"
#include "sm90/bwd_params.h"
#include "sm90/warpgroup_turns.h"
#include "sm90/wgmma_utils.h"

namespace flash::sm90 {

using namespace cute;

template <class Traits, bool kIsCausal, bool kVariants, bool kDeterministic>
__device__ __forceinline__ void bwd_consumer(BwdKernelParams<Traits> const &kp, typename Traits::SharedStorage &shared,
                                             typename Traits::PipelineQ &pipeline_q,
                                             typename Traits::PipelineQ &pipeline_do, int ctid) {
    using Element = typename Traits::Element;
    using BlockM = typename Traits::BlockM;
    using BlockN = typename Traits::BlockN;
    using HeadDim = typename Traits::HeadDim;
    Flash_bwd_params const &params = kp.params;
    const int warpgroup = ctid / 128;
    // kSplitHeadDim: both warpgroups hold the same S^T (one tiling of 128 threads each).
    const int score_thread = Traits::kSplitHeadDim ? ctid % 128 : ctid;
    using DkvCols = Int<Traits::kDkvCols>;
    const int dkv_block = Traits::kSplitHeadDim ? warpgroup : 0;
    const int dkv_col0 = dkv_block * Traits::kDkvCols;

    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(shared.d_o.data()), typename Traits::SmemLayoutQ{});
    Tensor sdOt = make_tensor(make_smem_ptr(shared.d_o.data()), typename Traits::SmemLayoutQt{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutK{});
    Tensor sDs = make_tensor(make_smem_ptr(shared.ds.data()), typename Traits::SmemLayoutDs{});

    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmaDKV mma_dkv;
    typename Traits::TiledMmaDQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(score_thread);
    auto thr_dkv = mma_dkv.get_thread_slice(score_thread);
    auto thr_dq = mma_dq.get_thread_slice(ctid % Traits::kDqThreads);
    Tensor tSrK = thr_sdp.partition_fragment_A(sK(_, _, _0{}));  // (MMA, 1, MMA_K): this warpgroup's keys
    Tensor tSrV = thr_sdp.partition_fragment_A(sV(_, _, _0{}));
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, 1, MMA_K, stage)
    Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
    // (MMA, 1, MMA_K, stage): this warpgroup's columns.
    using DkvB = Shape<DkvCols, BlockM, Int<Traits::kStages>>;
    Tensor tdVrdOt = thr_dkv.partition_fragment_B(local_tile(sdOt, DkvB{}, make_coord(dkv_block, _0{}, _0{})));
    Tensor tdKrQt = thr_dkv.partition_fragment_B(local_tile(sQt, DkvB{}, make_coord(dkv_block, _0{}, _0{})));
    // dQ's keys for this warpgroup: all of them (split columns), or its own.
    using DqKeys = Int<Traits::kDqKeys>;
    const int dq_key_block = Traits::kDqSplitColumns ? 0 : warpgroup;
    Tensor tdQrDs = thr_dq.partition_fragment_A(
        local_tile(sDs, Shape<BlockM, DqKeys, _2>{}, make_coord(_0{}, dq_key_block, _0{})));  // (MMA, 1, MMA_K, buffer)
    Tensor tdQrKt = thr_dq.partition_fragment_B(
        local_tile(sKt(_, _, _0{}), Shape<HeadDim, DqKeys>{}, make_coord(_0{}, dq_key_block)));
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));  // (key, query)
    Tensor tdKVcdKV = thr_dkv.partition_C(make_identity_tensor(Shape<BlockN, DkvCols>{}));
    // dS^T into its buffer by stmatrix (d = 64, 128): the accumulator's 8 x 8 tiles go out as they
    // are, each 16-byte row one key's 8 queries, which the MN-major buffer holds contiguous (one
    // 16-bit store per value, each with its own swizzled address, cost 6-13% of the step, run 228).
    auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
    auto thr_r2s_ds = r2s_ds.get_thread_slice(score_thread);
    Tensor tDSsDs = thr_r2s_ds.partition_D(make_tensor(sDs.data(), select<1, 0, 2>(sDs.layout())));  // (key, query)

    const bool dropout_on = kVariants && params.p_dropout > 0.f;
    uint64_t seed = 0, offset = 0;
    if (dropout_on) {
        dropout_seed_offset(params.philox, seed, offset);
        // Warp-uniform to ptxas, which then keeps Philox's round keys in uniform registers (as the
        // forward, fwd_consumer.h).
        seed = __shfl_sync(0xffffffff, seed, 0);
        offset = __shfl_sync(0xffffffff, offset, 0);
    }
    const int key0 = Traits::kSplitHeadDim ? 0 : warpgroup * 64;  // this warpgroup's keys in the block

    // d = 64 (whose warpgroups share no barrier in a step): the two warpgroups take turns issuing
    // their GEMMs, S^T and dP^T in one turn, dV and dK in the next, half a step apart, so that each
    // one's exponentials and dS^T run under the other's GEMMs. Per tile, warpgroup 1 takes an empty
    // turn first and warpgroup 0 one last: the next tile's K and V wait for both warpgroups' last
    // GEMMs, so no turn of a tile may wait for one of the next. Not in the deterministic kernel,
    // whose dQ adds also wait on other blocks (not measured with turns).
    constexpr bool kTurns = Traits::kHeadDim == 64 && !kDeterministic;
    // A barrier spanning both warpgroups within a step (kDsWritten) would wait for a turn the
    // other warpgroup takes only after it.
    static_assert(!kTurns || !Traits::kDqSplitColumns);
    const WarpgroupTurns<kTurns ? 2 : 1, uint32_t(BwdBarrier::kTurnOfWarpgroup0)> turns(warpgroup);
    const auto empty_turn_of = [&](int owner) {
        if (warpgroup == owner) {
            turns.skip();
        }
    };

    // kDeferredDqAdd: a Q block's staged dQ partial is reduced once the next block's S^T and dP^T are
    // issued, under them (the deterministic turns keep their order; d = 256 adds from registers).
    constexpr bool kDeferredDqAdd = Traits::kDqStaged && !kDeterministic;
    // Carried from tile to tile: the pipelines' stages, the dS^T (and dropout) buffer, the dQ staging.
    const DqReduction<Traits, kDeterministic> dq_out(shared, warpgroup, ctid % 128);
    typename Traits::PipelineState q_state, do_state;
    int ds_buffer = 0;
    int dq_buffer = 0;  // the dQ staging buffer the next partial goes to (kDeferredDqAdd)
    int kv_loads = 0;
    // Dropout's mask of a Q block, made in the loop's step before it (where the fewest registers
    // are live) into the buffer that dS^T of that block will use.
    const auto dropout_bytes = [&](int buffer) {
        return shared.dropout_bytes.data() + (2 * warpgroup + buffer) * kDropoutTileBytes;
    };
    const auto dropout_bytes_sync = [&] {
        cutlass::arch::NamedBarrier::sync(128, uint32_t(BwdBarrier::kDropoutBytesOfWarpgroup0) + warpgroup);
    };

    const int num_tiles = bwd_num_tiles<Traits>(params);
    ConsumerTiles<sm90_bwd_dynamic_tiles(kIsCausal, kDeterministic)> tiles(shared.tile_ring, num_tiles);
    for (int64_t tile = tiles.first(); tile < num_tiles; tile = tiles.next()) {
        const BwdBlock<Traits, kIsCausal> block(params, int(tile));
        const ScoreMod score_mod(params, block.bidb, block.bidh, block.binfo.causal_shift());
        const DropoutRng dropout(params, seed, offset, block.bidb, block.bidh);
        Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<BlockN, DkvCols>{});
        Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<BlockN, DkvCols>{});
        clear(acc_dk);
        clear(acc_dv);

        const BlockRange &m_blocks = block.m_blocks;
        const int col0 = block.col0();
        if (block.has_work()) {
            cutlass::arch::ClusterTransactionBarrier::wait(&shared.kv_full, kv_loads & 1);
            ++kv_loads;
            float *dq_accum = params.dq_accum_ptr +
                              block.binfo.template accum_row0<Traits::kBlockM>(params, block.bidh) * Traits::kHeadDim;
            if (dropout_on) {
                write_dropout_bytes(dropout, dropout_bytes(ds_buffer), m_blocks.begin * Traits::kBlockM, col0 + key0,
                                    ctid % 128);
            }
            const auto last_dq_buffer = [&] {
                return (dq_buffer + Traits::kDqStagingBuffers - 1) % Traits::kDqStagingBuffers;
            };
            const auto dq_of = [&](int m_block) {
                return dq_accum + int64_t(m_block) * Traits::kBlockM * Traits::kHeadDim;
            };
            empty_turn_of(1);
            for (int m_block = m_blocks.begin; m_block < m_blocks.end; ++m_block) {
                const int row0 = m_block * Traits::kBlockM;
                Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
                Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});

                // Lines 9 and 11: S^T = K Q^T, dP^T = V dO^T.
                pipeline_q.consumer_wait(q_state);
                if constexpr (kTurns) {  // not holding the turn while dO loads
                    pipeline_do.consumer_wait(do_state);
                    turns.wait();
                }
                wgmma_gemm</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, q_state.index()), acc_s);
                if constexpr (!kTurns) {
                    pipeline_do.consumer_wait(do_state);
                }
                wgmma_gemm</*kZeroInit=*/true>(mma_sdp, tSrV, tSrdO(_, _, _, do_state.index()), acc_dp);
                turns.pass();
                dq_out.release_under_gemms();
                if constexpr (kDeferredDqAdd) {
                    // The first step has no previous block: the barrier alone, without a branch.
                    const bool has_previous = m_block > m_blocks.begin;
                    dq_out.start_reduction(dq_of(has_previous ? m_block - 1 : m_block), last_dq_buffer(), has_previous);
                }

                // Line 10: P^T = exp(S^T - L) with the forward's logsumexp (+inf on rows past the
                // sequence, whose P is then 0), masked entries 0; scale_log2 takes S^T (or the score
                // modification's t) to log2 units.
                float const *lse_log2 = shared.lse_log2.data() + q_state.index() * Traits::kBlockM;
                float const *dot_do_o = shared.dot_do_o.data() + do_state.index() * Traits::kBlockM;
                const auto p_from_scores = [&](float scale_log2) {
                    const auto edges = block.mask.edges(row0, col0, Traits::kBlockM, Traits::kBlockN);
                    if (edges.any()) {
                        block.mask.template apply</*kTransposed=*/true>(acc_s, tScS, row0, col0, edges);
                    }
                    CUTE_UNROLL
                    for (int i = 0; i < size(acc_s); ++i) {
                        acc_s(i) = exp2f(acc_s(i) * scale_log2 - lse_log2[get<1>(tScS(i))]);
                    }
                };
                // The variants: with dropout (mask Z, scale z) the forward's output was (z Z o P) V, so
                // dV takes Z o P (z applied to dV at the end) and dS = P o (z Z o dP - D); with softcap
                // (S^T holding t = tanh(...)), dS also takes softcap's derivative 1 - t^2
                // (common/score_mod.h). At d = 64, t and P^T are made before the dP^T wait, as the plain
                // path's P^T is, and 1 - t^2 is kept until dP^T is in (run 311: 2% off at 4k-16k); d = 128
                // lacks the registers for that (52 bytes of spills, 264 in the deterministic kernel), so
                // it waits for dP^T first and folds 1 - t^2 into it at once.
                const auto read_keep = [&] {
                    dropout_bytes_sync();
                    return read_dropout_bytes(dropout_bytes(ds_buffer), tScS, key0);
                };
                if (kVariants && score_mod.softcapped()) {
                    constexpr bool kSlopeUnderDp = Traits::kHeadDim <= 64;
                    DropoutKeep keep{};
                    const auto dp_of_kept = [&] {  // z Z o dP^T
                        warpgroup_fence_operand(acc_dp);
                        if (dropout_on) {
                            keep = read_keep();
                            CUTE_UNROLL
                            for (int i = 0; i < size(acc_dp); ++i) {
                                acc_dp(i) = keep.kept(i) ? acc_dp(i) * params.dropout_scale : 0.f;
                            }
                        }
                    };
                    warpgroup_wait<kSlopeUnderDp ? 1 : 0>();
                    warpgroup_fence_operand(acc_s);
                    if constexpr (!kSlopeUnderDp) {
                        dp_of_kept();
                    }
                    Tensor tanh_slope = make_tensor<float>(acc_s.layout());
                    CUTE_UNROLL
                    for (int i = 0; i < size(acc_s); ++i) {
                        const float t = tanhf(acc_s(i) * score_mod.tanh_prescale);
                        acc_s(i) = t;
                        if constexpr (kSlopeUnderDp) {
                            tanh_slope(i) = fmaf(-t, t, 1.f);
                        } else {
                            acc_dp(i) = (acc_dp(i) - dot_do_o[get<1>(tScS(i))]) * (1.f - t * t);
                        }
                    }
                    score_mod.template add_bias</*kTransposed=*/true>(acc_s, tScS, row0, col0);
                    p_from_scores(score_mod.score_scale_log2);
                    if constexpr (kSlopeUnderDp) {
                        warpgroup_wait<0>();
                        dp_of_kept();
                        CUTE_UNROLL
                        for (int i = 0; i < size(acc_dp); ++i) {
                            acc_dp(i) = (acc_dp(i) - dot_do_o[get<1>(tScS(i))]) * tanh_slope(i);
                        }
                    }
                    CUTE_UNROLL
                    for (int i = 0; i < size(acc_dp); ++i) {
                        acc_dp(i) *= acc_s(i);
                    }
                    if (dropout_on) {
                        CUTE_UNROLL
                        for (int i = 0; i < size(acc_s); ++i) {
                            acc_s(i) = keep.kept(i) ? acc_s(i) : 0.f;
                        }
                    }
                } else {
                    warpgroup_wait<1>();
                    warpgroup_fence_operand(acc_s);
                    if constexpr (kVariants) {
                        score_mod.template add_bias</*kTransposed=*/true>(acc_s, tScS, row0, col0);
                    }
                    p_from_scores(kVariants ? score_mod.score_scale_log2 : params.softmax_scale_log2);

                    // Line 13: dS^T = P^T o (dP^T - D); with dropout, one test of an entry's keep bit
                    // serves both dP^T and P^T.
                    warpgroup_wait<0>();
                    warpgroup_fence_operand(acc_dp);
                    if (dropout_on) {
                        const DropoutKeep keep = read_keep();
                        CUTE_UNROLL
                        for (int i = 0; i < size(acc_dp); ++i) {
                            const bool kept = keep.kept(i);
                            const float dp = kept ? acc_dp(i) : 0.f;
                            acc_dp(i) = acc_s(i) * fmaf(dp, params.dropout_scale, -dot_do_o[get<1>(tScS(i))]);
                            acc_s(i) = kept ? acc_s(i) : 0.f;
                        }
                    } else {
                        CUTE_UNROLL
                        for (int i = 0; i < size(acc_dp); ++i) {
                            acc_dp(i) = acc_s(i) * (acc_dp(i) - dot_do_o[get<1>(tScS(i))]);
                        }
                    }
                }
                Tensor p = make_tensor<Element>(acc_s.layout());
                Tensor ds = make_tensor<Element>(acc_dp.layout());
                convert(acc_s, p);
                convert(acc_dp, ds);

                // Lines 12 and 16: dV += P^T dO, dK += dS^T Q (scaled at the end).
                warpgroup_fence_operand(p);
                warpgroup_fence_operand(ds);
                turns.wait();
                wgmma_gemm</*kZeroInit=*/false>(mma_dkv, make_tensor(p.data(), acc_as_operand_a(p.layout())),
                                                tdVrdOt(_, _, _, do_state.index()), acc_dv);
                wgmma_gemm</*kZeroInit=*/false>(mma_dkv, make_tensor(ds.data(), acc_as_operand_a(ds.layout())),
                                                tdKrQt(_, _, _, q_state.index()), acc_dk);
                turns.pass();

                // Line 15: dQ_i += dS K over this block's keys, dS^T through shared memory (of both
                // warpgroups where they split the columns; where both hold all of it, each writes
                // the half of its queries). Two buffers: a warpgroup writes this one only after both
                // have passed the barrier of the previous Q block, so after both waited for their
                // dQ GEMM before it.
                // d = 256: the copy's last value mode steps 16 queries (one stmatrix.x4 each), so a
                // warpgroup stores chunks {0, 1} (queries below 32) or {2, 3}.
                Tensor ds_out = thr_r2s_ds.retile_S(ds);
                Tensor ds_in = tDSsDs(_, _, _, ds_buffer);
                const auto store_ds = [&](auto chunk) {
                    copy(r2s_ds, ds_out(make_coord(_, chunk), _, _), ds_in(make_coord(_, chunk), _, _));
                };
                if constexpr (!Traits::kSplitHeadDim) {
                    copy(r2s_ds, ds_out, ds_in);
                } else if (warpgroup == 0) {
                    store_ds(_0{});
                    store_ds(_1{});
                } else {
                    store_ds(_2{});
                    store_ds(_3{});
                }
                cutlass::arch::fence_view_async_shared();
                if constexpr (Traits::kDqSplitColumns) {
                    cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, uint32_t(BwdBarrier::kDsWritten));
                } else {
                    dq_out.sync();
                }
                if constexpr (Traits::kSplitHeadDim) {
                    // P^T and dS^T free their registers before dQ's accumulator takes 64 more.
                    warpgroup_wait<0>();
                    warpgroup_fence_operand(p);
                    warpgroup_fence_operand(ds);
                }
                Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
                wgmma_gemm</*kZeroInit=*/true>(mma_dq, tdQrDs(_, _, _, ds_buffer), tdQrKt, acc_dq);
                warpgroup_wait<0>();
                warpgroup_fence_operand(acc_dv);
                warpgroup_fence_operand(acc_dk);
                warpgroup_fence_operand(acc_dq);
                warpgroup_fence_operand(p);
                warpgroup_fence_operand(ds);
                pipeline_q.consumer_release(q_state);
                pipeline_do.consumer_release(do_state);
                ++q_state;
                ++do_state;
                ds_buffer ^= 1;
                if constexpr (kDeferredDqAdd) {
                    dq_out.stage(acc_dq, dq_buffer);
                    dq_buffer = (dq_buffer + 1) % Traits::kDqStagingBuffers;
                } else {
                    dq_out.add(acc_dq, dq_accum + int64_t(row0) * Traits::kHeadDim, params, block, m_block);
                }
                if (dropout_on && m_block + 1 < m_blocks.end) {
                    write_dropout_bytes(dropout, dropout_bytes(ds_buffer), row0 + Traits::kBlockM, col0 + key0,
                                        ctid % 128);
                }
            }
            // Every GEMM that reads K and V has been waited for: the producer may load the next
            // tile's.
            cutlass::arch::ClusterBarrier::arrive(&shared.kv_empty);
            empty_turn_of(0);
            if constexpr (kDeferredDqAdd) {
                dq_out.start_reduction(dq_of(m_blocks.end - 1), last_dq_buffer(), true);
            }
            dq_out.release_pending();  // deterministic: the tile's last add
        }

        // Line 21: dK (with the softmax scale the S above left out) and dV of this warpgroup's keys;
        // zeros for keys that no query sees.
        // The sequence's offsets read again here rather than held in registers through the loop.
        const BlockInfo binfo(params, block.bidb);
        const int64_t head_k =
            binfo.k_offset(params.dk_batch_stride, params.dk_row_stride) + int64_t(block.bidh) * params.dk_head_stride;
        const int64_t head_v =
            binfo.k_offset(params.dv_batch_stride, params.dv_row_stride) + int64_t(block.bidh) * params.dv_head_stride;
        Element *dk = static_cast<Element *>(params.dk_ptr) + head_k + dkv_col0;
        Element *dv = static_cast<Element *>(params.dv_ptr) + head_v + dkv_col0;
        const float dv_scale = dropout_on ? params.dropout_scale : 1.f;
        if constexpr (Traits::kDqStaged) {
            // Staged through this warpgroup's dQ staging buffer that the next Q block's partial goes
            // to, once the reductions that read it have: all but the tile's last (two buffers), or
            // all. dK's rows have left it before dV's come in; the next stage() waits at the same
            // barrier before writing it. dk and dv are 16-byte aligned rows (api/checks.cpp).
            constexpr int kReductionsLeft = kDeferredDqAdd ? Traits::kDqStagingBuffers - 1 : 0;
            Tensor staging = key_rows_staging<Traits::kHeadDim, 2 * Traits::kDqWarpgroupFloats>(
                reinterpret_cast<Element *>(dq_out.template borrow<kReductionsLeft>(kDeferredDqAdd ? dq_buffer : 0)));
            const auto sync = [&] { dq_out.sync(); };
            store_key_rows_staged<Traits::kHeadDim>(mma_dkv, score_thread, acc_dk, params.softmax_scale, staging, sync,
                                                    warpgroup, ctid % 128, dk, params.dk_row_stride, col0,
                                                    binfo.seqlen_k);
            sync();
            store_key_rows_staged<Traits::kHeadDim>(mma_dkv, score_thread, acc_dv, dv_scale, staging, sync, warpgroup,
                                                    ctid % 128, dv, params.dv_row_stride, col0, binfo.seqlen_k);
        } else {
            store_key_rows(acc_dk, tdKVcdKV, params.softmax_scale, dk, params.dk_row_stride, col0, binfo.seqlen_k);
            store_key_rows(acc_dv, tdKVcdKV, dv_scale, dv, params.dv_row_stride, col0, binfo.seqlen_k);
        }
    }
    dq_out.finish();
}

}  // namespace flash::sm90
