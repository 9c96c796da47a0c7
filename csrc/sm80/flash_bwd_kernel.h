// FlashAttention-2 backward, Algorithm 2 of the paper, with the Ampere tensor-core MMA.
// One thread block per (column block j of K/V, batch, head): dK_j and dV_j accumulate in
// registers over the Q blocks i; dQ_i is added into an fp32 buffer with atomics (the paper's
// sequence-parallel backward). P is recomputed from the forward's logsumexp L.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/block_range.h"
#include "common/dropout.h"
#include "common/flash.h"
#include "common/mask.h"
#include "common/score_mod.h"
#include "sm80/block_semaphore.h"
#include "sm80/dq_accum.h"
#include "sm80/dropout_bits.h"
#include "sm80/utils.h"

namespace flash {

using namespace cute;

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads) flash_bwd_kernel(const __grid_constant__ Flash_bwd_params params) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kStages = Traits::kStagesQdO;

    extern __shared__ __align__(128) char smem[];

    const int n_block = blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / (params.num_heads / params.num_heads_k);
    const int tidx = threadIdx.x;

    const BlockInfo binfo(params, bidb);
    const int col0 = n_block * kBlockN;
    if (col0 >= binfo.seqlen_k) {
        return;
    }
    const Mask<kIsCausal> mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right};
    // Q blocks [m_block_min, m_block_max) hold every query that sees some key of this block; the
    // others (above the causal diagonal, outside the window) are skipped whole.
    const BlockRange m_blocks = q_block_range(mask, col0, kBlockM, kBlockN, binfo.seqlen_q);
    const ScoreMod score_mod(params, bidb, bidh, binfo.causal_shift());
    // Dropout is a runtime switch here: the backward's other work hides its cost better than the
    // forward's, and a compile-time one would double the slowest instantiations to build.
    const bool dropout_on = params.p_dropout > 0.f;
    uint64_t seed = 0, offset = 0;
    if (dropout_on) {
        dropout_seed_offset(params.philox, seed, offset);
    }
    const DropoutRng dropout(params, seed, offset, bidb, bidh);
    const int m_block_min = m_blocks.begin, m_block_max = m_blocks.end;

    // Algorithm 2 lines 1-3: the blocks of Q, dO (over i), K_j, V_j, dK_j, dV_j and dQ (fp32).
    auto tile_qo = Shape<Int<kBlockM>, Int<kHeadDim>>{};
    auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
    auto q_rows = [&](void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
        return binfo.q_rows<Element, kHeadDim>(ptr, batch_stride, row_stride, head_stride, bidh);
    };
    auto k_rows = [&](void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int head) {
        return binfo.k_rows<Element, kHeadDim>(ptr, batch_stride, row_stride, head_stride, head);
    };
    // (kBlockM, kHeadDim, m_blocks)
    Tensor gQ = local_tile(q_rows(params.q_ptr, params.q_batch_stride, params.q_row_stride, params.q_head_stride),
                           tile_qo, make_coord(_, 0));
    Tensor gdO = local_tile(q_rows(params.do_ptr, params.do_batch_stride, params.do_row_stride, params.do_head_stride),
                            tile_qo, make_coord(_, 0));
    // (kBlockN, kHeadDim): K_j, V_j of this block's K/V head; dK_j, dV_j of its query head.
    Tensor gK = local_tile(k_rows(params.k_ptr, params.k_batch_stride, params.k_row_stride, params.k_head_stride, bidh_k),
                           tile_kv, make_coord(n_block, 0));
    Tensor gV = local_tile(k_rows(params.v_ptr, params.v_batch_stride, params.v_row_stride, params.v_head_stride, bidh_k),
                           tile_kv, make_coord(n_block, 0));
    Tensor gdK = local_tile(k_rows(params.dk_ptr, params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride, bidh),
                            tile_kv, make_coord(n_block, 0));
    Tensor gdV = local_tile(k_rows(params.dv_ptr, params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride, bidh),
                            tile_kv, make_coord(n_block, 0));
    const int64_t accum_row0 = binfo.accum_row0<kBlockM>(params, bidh);
    // This (batch, head)'s dQ accumulator, one block of kBlockM x kHeadDim floats per Q block.
    float *dq_accum = params.dq_accum_ptr + accum_row0 * kHeadDim;
    const float *lse = params.softmax_lse_ptr + binfo.lse_row0(params, bidh);
    const float *dsum = params.softmax_d_ptr + accum_row0;
    int *semaphore = params.dq_semaphore_ptr == nullptr
                         ? nullptr
                         : params.dq_semaphore_ptr +
                               (int64_t(bidb) * params.num_heads + bidh) * ceil_div(params.seqlen_q, kBlockM);

    // Shared memory: K, V, then kStages x Q, kStages x dO, then P and dS.
    Element *smem_k = reinterpret_cast<Element *>(smem);
    Element *smem_q = smem_k + 2 * Traits::kSmemKVElems;
    Element *smem_do = smem_q + kStages * Traits::kSmemQdOElems;
    Element *smem_p = smem_do + kStages * Traits::kSmemQdOElems;
    Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem_k + Traits::kSmemKVElems), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});
    Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPdS{});
    Tensor sdS = make_tensor(make_smem_ptr(smem_p + Traits::kSmemPdSElems), typename Traits::SmemLayoutPdS{});
    Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});
    Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});
    auto stage_tensor = [&](Element *base, int stage, auto layout) {
        return make_tensor(make_smem_ptr(base + stage * Traits::kSmemQdOElems), layout);
    };
    using LayoutQdO = typename Traits::SmemLayoutQdO;
    using LayoutQdOt = typename Traits::SmemLayoutQdOt;

    typename Traits::GmemTiledCopyIn gmem_tiled_copy;
    auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
    Tensor tQgQ = gmem_thr_copy.partition_S(gQ);  // (CPY, CPY_M, CPY_K, m_blocks)
    Tensor tdOgdO = gmem_thr_copy.partition_S(gdO);
    Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(tile_qo));
    Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(tile_kv));
    // Line 9 for Q_i and dO_i (L_i and D_i are read straight into registers).
    auto load_q_do = [&](int m_block, int stage) {
        const int rows = binfo.seqlen_q - m_block * kBlockM;
        copy_zfill(gmem_tiled_copy, tQgQ(_, _, _, m_block),
                   gmem_thr_copy.partition_D(stage_tensor(smem_q, stage, LayoutQdO{})), tQcQ, rows);
        copy_zfill(gmem_tiled_copy, tdOgdO(_, _, _, m_block),
                   gmem_thr_copy.partition_D(stage_tensor(smem_do, stage, LayoutQdO{})), tQcQ, rows);
    };

    // S = Q K^T and dP = dO V^T: both operands as stored.
    typename Traits::TiledMmaSdP mma_sdp;
    auto thr_sdp = mma_sdp.get_thread_slice(tidx);
    Tensor tSrQ = thr_sdp.partition_fragment_A(stage_tensor(smem_q, 0, LayoutQdO{}));
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);
    Tensor tdPrdO = thr_sdp.partition_fragment_A(stage_tensor(smem_do, 0, LayoutQdO{}));
    Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
    auto smem_copy_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto smem_copy_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto smem_thr_copy_sdp_a = smem_copy_sdp_a.get_thread_slice(tidx);
    Tensor tSsK = smem_copy_sdp_b.get_thread_slice(tidx).partition_S(sK);
    Tensor tdPsV = smem_copy_sdp_b.get_thread_slice(tidx).partition_S(sV);
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));
    auto smem_copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomAcc{}, mma_sdp);
    auto smem_thr_copy_pds = smem_copy_pds.get_thread_slice(tidx);
    Tensor tPsP = smem_thr_copy_pds.partition_D(sP);
    Tensor tdSsdS = smem_thr_copy_pds.partition_D(sdS);

    // dV += P^T dO and dK += dS^T Q: both operands read transposed.
    typename Traits::TiledMmadKV mma_dkv;
    auto thr_dkv = mma_dkv.get_thread_slice(tidx);
    Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);
    Tensor tdVrdOt = thr_dkv.partition_fragment_B(stage_tensor(smem_do, 0, LayoutQdOt{}));
    Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);
    Tensor tdKrQt = thr_dkv.partition_fragment_B(stage_tensor(smem_q, 0, LayoutQdOt{}));
    auto smem_copy_dkv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto smem_copy_dkv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto smem_thr_copy_dkv_b = smem_copy_dkv_b.get_thread_slice(tidx);
    Tensor tdVsPt = smem_copy_dkv_a.get_thread_slice(tidx).partition_S(sPt);
    Tensor tdKsdSt = smem_copy_dkv_a.get_thread_slice(tidx).partition_S(sdSt);

    // dQ = dS K: K read transposed.
    typename Traits::TiledMmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tidx);
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
    Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);
    auto smem_copy_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
    auto smem_copy_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
    Tensor tdQsdS = smem_copy_dq_a.get_thread_slice(tidx).partition_S(sdS);
    Tensor tdQsKt = smem_copy_dq_b.get_thread_slice(tidx).partition_S(sKt);

    // Line 7.
    Tensor acc_dk = partition_fragment_C(mma_dkv, tile_kv);
    Tensor acc_dv = partition_fragment_C(mma_dkv, tile_kv);
    clear(acc_dk);
    clear(acc_dv);

    if (m_block_min < m_block_max) {
        // Line 6, and line 9 for the first Q block.
        copy_zfill(gmem_tiled_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), tKVcKV,
                   binfo.seqlen_k - col0);
        copy_zfill(gmem_tiled_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), tKVcKV,
                   binfo.seqlen_k - col0);
        load_q_do(m_block_min, 0);
        cp_async_fence();
    }

    for (int m_block = m_block_min; m_block < m_block_max; ++m_block) {
        const int stage = kStages == 1 ? 0 : (m_block - m_block_min) % kStages;
        const int row0 = m_block * kBlockM;

        // Line 9 for L_i and D_i, this thread's rows of S. Rows past seqlen_q get L = +inf, so P = 0.
        constexpr int kRows = decltype(size<0>(tScS_rc))::value;
        float lse_log2[kRows];
        float d_rows[kRows];
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const int row = row0 + get<0>(tScS_rc(r, 0));
            lse_log2[r] = row < binfo.seqlen_q ? lse[row] * float(M_LOG2E) : INFINITY;
            d_rows[r] = dsum[row];
        }

        cp_async_wait<0>();
        __syncthreads();  // Q_i, dO_i (and K_j, V_j) visible; everyone is done with the last P, dS
        if constexpr (kStages == 2) {
            if (m_block + 1 < m_block_max) {
                load_q_do(m_block + 1, stage ^ 1);
                cp_async_fence();
            }
        }

        // Line 10: S = Q_i K_j^T; line 13: dP = dO_i V_j^T.
        Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        clear(acc_dp);
        gemm_ss(mma_sdp, acc_s, tSrQ, tSrK, smem_thr_copy_sdp_a.partition_S(stage_tensor(smem_q, stage, LayoutQdO{})),
                tSsK, smem_copy_sdp_a, smem_copy_sdp_b);
        gemm_ss(mma_sdp, acc_dp, tdPrdO, tdPrV,
                smem_thr_copy_sdp_a.partition_S(stage_tensor(smem_do, stage, LayoutQdO{})), tdPsV, smem_copy_sdp_a,
                smem_copy_sdp_b);
        // With dropout (mask Z, scale z = 1 / (1 - p)) the forward's output was (z Z o P) V: dV takes
        // z Z o P, and dS = P o (z Z o dP - D), D = rowsum(dO o O) being unchanged.
        uint32_t keep[(decltype(size(acc_s))::value + 31) / 32];
        if (dropout_on) {
            dropout_keep_bits<kBlockN>(dropout, tScS, row0, col0, keep);
            CUTE_UNROLL
            for (int i = 0; i < size(acc_dp); ++i) {
                acc_dp(i) = is_kept(keep, i) ? acc_dp(i) * params.dropout_scale : 0.f;
            }
        }
        // Line 11: P = exp(S - L); line 14: dS = P o (dP - D).
        const auto edges = mask.edges(row0, col0, kBlockM, kBlockN);
        const bool masked = edges.any();
        Tensor s = make_tensor(acc_s.data(), rowcol(acc_s.layout()));
        Tensor dp = make_tensor(acc_dp.data(), rowcol(acc_dp.layout()));
        if (score_mod.softcapped()) {
            // P from the modified score; dS through softcap's derivative, d(softcap * t)/dS =
            // softmax_scale * (1 - t^2), whose softmax_scale is applied to dK and dQ at the end.
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r) {
                CUTE_UNROLL
                for (int c = 0; c < size<1>(s); ++c) {
                    const int row = row0 + get<0>(tScS_rc(r, c)), col = col0 + get<1>(tScS_rc(r, c));
                    const float t = score_mod.capped(s(r, c));
                    const float p = !masked || mask.visible(row, col)
                                        ? exp2f((t + score_mod.bias(row, col)) * score_mod.score_scale_log2 - lse_log2[r])
                                        : 0.f;
                    s(r, c) = p;
                    dp(r, c) = p * (dp(r, c) - d_rows[r]) * (1.f - t * t);
                }
            }
        } else {
            // ALiBi alone adds its bias to S (in S's units) and leaves dS as it is.
            score_mod.apply(acc_s, tScS, row0, col0);
            if (masked) {
                mask.apply(acc_s, tScS, row0, col0, edges);
            }
            CUTE_UNROLL
            for (int r = 0; r < kRows; ++r) {
                CUTE_UNROLL
                for (int c = 0; c < size<1>(s); ++c) {
                    const float p = exp2f(s(r, c) * params.softmax_scale_log2 - lse_log2[r]);
                    s(r, c) = p;
                    dp(r, c) = p * (dp(r, c) - d_rows[r]);
                }
            }
        }
        if (dropout_on) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) {
                acc_s(i) = is_kept(keep, i) ? acc_s(i) * params.dropout_scale : 0.f;
            }
        }
        Tensor rP = convert_type<Element>(acc_s);
        Tensor rdS = convert_type<Element>(acc_dp);
        copy(smem_copy_pds, smem_thr_copy_pds.retile_S(rP), tPsP);
        copy(smem_copy_pds, smem_thr_copy_pds.retile_S(rdS), tdSsdS);
        __syncthreads();  // P and dS visible

        // Line 15: dQ_i += dS K_j, added into the fp32 buffer (scaled by the postprocess kernel).
        // add_dq_part(part, parts) issues the part-th of `parts` equal slices of the adds.
        Tensor acc_dq = partition_fragment_C(mma_dq, tile_qo);
        constexpr int kAdds = decltype(size(acc_dq))::value / 4;
        static_assert(decltype(size(acc_dq))::value % 4 == 0);
        float *dq_tile = dq_accum + int64_t(m_block) * kBlockM * kHeadDim;
        auto compute_dq = [&] {
            clear(acc_dq);
            gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, smem_copy_dq_a, smem_copy_dq_b);
            if (semaphore != nullptr) {
                // The KV blocks that add into this Q block are a range (block_range.h): this one's
                // turn is its place in it.
                semaphore_wait(semaphore + m_block, n_block - kv_block_range(mask, row0, kBlockM, kBlockN).begin);
            }
        };
        auto add_dq_part = [&](int part, int parts) {
            CUTE_UNROLL
            for (int a = 0; a < kAdds; ++a) {
                if (a * parts / kAdds == part) {
                    red_add4(dq_tile + dq_accum_index<Traits::kNThreads>(4 * a, tidx),
                             make_float4(acc_dq(4 * a), acc_dq(4 * a + 1), acc_dq(4 * a + 2), acc_dq(4 * a + 3)));
                }
            }
        };
        auto release_dq = [&] {
            if (semaphore != nullptr) {
                semaphore_release(semaphore + m_block);
            }
        };

        // Line 12: dV_j += P^T dO_i.
        gemm_ss(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt,
                smem_thr_copy_dkv_b.partition_S(stage_tensor(smem_do, stage, LayoutQdOt{})), smem_copy_dkv_a,
                smem_copy_dkv_b);
        // Line 16: dK_j += dS^T Q_i (scaled once at the end). With kDqBeforeDk, dQ is computed first
        // and its adds are spread over the k-steps of this GEMM, so that the memory queue drains
        // while the tensor cores work.
        if constexpr (Traits::kDqBeforeDk) {
            compute_dq();
        }
        gemm_ss(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt,
                smem_thr_copy_dkv_b.partition_S(stage_tensor(smem_q, stage, LayoutQdOt{})), smem_copy_dkv_a,
                smem_copy_dkv_b, [&](int k, int steps) {
                    if constexpr (Traits::kDqBeforeDk) {
                        add_dq_part(k, steps);
                    }
                });
        if constexpr (Traits::kDqBeforeDk) {
            release_dq();
        }

        // With one buffer, the next Q and dO load once the dK GEMM is done with Q_i (and dV with
        // dO_i); the dQ GEMM after it reads only dS and K.
        if constexpr (kStages == 1) {
            if (m_block + 1 < m_block_max) {
                __syncthreads();  // everyone is done reading Q_i and dO_i
                load_q_do(m_block + 1, 0);
                cp_async_fence();
            }
        }
        if constexpr (!Traits::kDqBeforeDk) {
            compute_dq();
            add_dq_part(0, 1);
            release_dq();
        }
    }

    // Line 18: write dK_j (times the softmax scale: S was computed unscaled) and dV_j, through
    // the shared memory of K and V so that the global stores are 16 bytes wide.
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) {
        acc_dk(i) *= params.softmax_scale;
    }
    Tensor rdK = convert_type<Element>(acc_dk);
    Tensor rdV = convert_type<Element>(acc_dv);
    auto smem_copy_dkv = make_tiled_copy_C(typename Traits::SmemCopyAtomAcc{}, mma_dkv);
    auto smem_thr_copy_dkv = smem_copy_dkv.get_thread_slice(tidx);
    __syncthreads();  // everyone is done reading K_j and V_j
    copy(smem_copy_dkv, smem_thr_copy_dkv.retile_S(rdK), smem_thr_copy_dkv.partition_D(sK));
    copy(smem_copy_dkv, smem_thr_copy_dkv.retile_S(rdV), smem_thr_copy_dkv.partition_D(sV));
    __syncthreads();

    typename Traits::GmemTiledCopyOut gmem_tiled_copy_out;
    auto gmem_thr_copy_out = gmem_tiled_copy_out.get_thread_slice(tidx);
    Tensor tdKVcdKV = gmem_thr_copy_out.partition_D(make_identity_tensor(tile_kv));
    Tensor tdKgdK = gmem_thr_copy_out.partition_D(gdK);
    Tensor tdVgdV = gmem_thr_copy_out.partition_D(gdV);
    Tensor tdKrdK = make_tensor<Element>(shape(tdKgdK));
    Tensor tdVrdV = make_tensor<Element>(shape(tdVgdV));
    copy(gmem_tiled_copy_out, gmem_thr_copy_out.partition_S(sK), tdKrdK);
    copy(gmem_tiled_copy_out, gmem_thr_copy_out.partition_S(sV), tdVrdV);
    copy_guarded(gmem_tiled_copy_out, tdKrdK, tdKgdK, tdKVcdKV, binfo.seqlen_k - col0);
    copy_guarded(gmem_tiled_copy_out, tdVrdV, tdVgdV, tdKVcdKV, binfo.seqlen_k - col0);
}

}  // namespace flash
