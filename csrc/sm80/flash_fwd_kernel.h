// FlashAttention-2 forward, Algorithm 1 of the paper, with the Ampere tensor-core MMA.
// One thread block per (row block of Q, batch, head); warps split the rows of Q.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/block_range.h"
#include "common/dropout.h"
#include "common/flash.h"
#include "common/mask.h"
#include "common/score_mod.h"
#include "common/softmax.h"
#include "sm80/dropout_bits.h"
#include "sm80/utils.h"

namespace flash {

using namespace cute;

// kScoreMod: softcap and ALiBi (common/score_mod.h) on; a compile-time switch because a runtime
// one kept their registers live in the kernels without them (d=128 spills 100 -> 300 bytes).
// Dropout (common/dropout.h) likewise, compiled only with kScoreMod; writing the probabilities
// (return_attn_probs) is a kernel of its own, as it cost the dropout kernel spills.
enum class FwdDropout { kOff, kOn, kOnWithProbs };

template <typename Traits, bool kIsCausal, bool kScoreMod, FwdDropout kDropoutMode>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_kernel(const __grid_constant__ Flash_fwd_params params) {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr bool kDropout = kDropoutMode != FwdDropout::kOff;

    extern __shared__ __align__(128) char smem[];

    // Causal row blocks near the bottom have the most work: start them first.
    const int m_block = gridDim.x - 1 - blockIdx.x;
    const int bidb = blockIdx.y;
    const int bidh = blockIdx.z;
    const int bidh_k = bidh / (params.num_heads / params.num_heads_k);
    const int tidx = threadIdx.x;

    uint64_t seed = 0, offset = 0;
    if constexpr (kDropout) {
        dropout_seed_offset(params.philox, seed, offset);
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tidx == 0) {
            params.rng_state_ptr[0] = int64_t(seed);
            params.rng_state_ptr[1] = int64_t(offset);
        }
    }

    const BlockInfo binfo(params, bidb);
    const int row0 = m_block * kBlockM;
    if (row0 >= binfo.seqlen_q) {
        return;
    }
    const Mask<kIsCausal> mask{binfo.seqlen_k, binfo.causal_shift(), params.window_left, params.window_right};
    const BlockRange n_blocks = kv_block_range(mask, row0, kBlockM, kBlockN);
    const ScoreMod score_mod(params, bidb, bidh, binfo.causal_shift());
    const DropoutRng dropout(params, seed, offset, bidb, bidh);
    Element *s_dmask = kDropoutMode == FwdDropout::kOnWithProbs
                           ? reinterpret_cast<Element *>(params.s_dmask_ptr) + bidb * params.s_dmask_batch_stride +
                                 bidh * params.s_dmask_head_stride
                           : nullptr;

    // Algorithm 1 lines 1-2: this block's Q_i and O_i, and all K_j, V_j of its (batch, head).
    auto tile_qo = Shape<Int<kBlockM>, Int<kHeadDim>>{};
    auto tile_kv = Shape<Int<kBlockN>, Int<kHeadDim>>{};
    auto q_rows = [&](void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
        return binfo.q_rows<Element, kHeadDim>(ptr, batch_stride, row_stride, head_stride, bidh);
    };
    auto k_rows = [&](void *ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
        return binfo.k_rows<Element, kHeadDim>(ptr, batch_stride, row_stride, head_stride, bidh_k);
    };
    Tensor gQ = local_tile(q_rows(params.q_ptr, params.q_batch_stride, params.q_row_stride, params.q_head_stride),
                           tile_qo, make_coord(m_block, 0));
    Tensor gO = local_tile(q_rows(params.o_ptr, params.o_batch_stride, params.o_row_stride, params.o_head_stride),
                           tile_qo, make_coord(m_block, 0));
    // (kBlockN, kHeadDim, n_blocks)
    Tensor gK = local_tile(k_rows(params.k_ptr, params.k_batch_stride, params.k_row_stride, params.k_head_stride),
                           tile_kv, make_coord(_, 0));
    Tensor gV = local_tile(k_rows(params.v_ptr, params.v_batch_stride, params.v_row_stride, params.v_head_stride),
                           tile_kv, make_coord(_, 0));

    Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element *>(smem)), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
    Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});

    typename Traits::GmemTiledCopyIn gmem_tiled_copy;
    auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
    Tensor tQgQ = gmem_thr_copy.partition_S(gQ);
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
    Tensor tKgK = gmem_thr_copy.partition_S(gK);  // (CPY, CPY_N, CPY_K, n_blocks)
    Tensor tKsK = gmem_thr_copy.partition_D(sK);
    Tensor tVgV = gmem_thr_copy.partition_S(gV);
    Tensor tVsV = gmem_thr_copy.partition_D(sV);
    Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(tile_qo));
    Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(tile_kv));

    typename Traits::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(tidx);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
    Tensor tSrK = thr_mma.partition_fragment_B(sK);
    Tensor tOrVt = thr_mma.partition_fragment_B(sVt);
    Tensor acc_o = partition_fragment_C(tiled_mma, tile_qo);
    Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));

    auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
    auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
    Tensor tSsQ = smem_copy_q.get_thread_slice(tidx).partition_S(sQ);
    Tensor tSsK = smem_copy_k.get_thread_slice(tidx).partition_S(sK);
    Tensor tOsVt = smem_copy_v.get_thread_slice(tidx).partition_S(sVt);

    // Line 5: O = 0, l = 0, m = -inf.
    clear(acc_o);
    OnlineSoftmax<decltype(size<0>(rowcol(acc_o.layout())))::value> softmax;

    // One step of the inner loop (Algorithm 1 lines 7-10) for KV block n_block. One shared buffer
    // each for K and V: the load of V_j overlaps S = Q K_j^T, the load of K_{j-1} overlaps P V_j.
    auto kv_step = [&](int n_block, auto masked) {
        const int col0 = n_block * kBlockN;
        Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
        clear(acc_s);
        cp_async_wait<0>();
        __syncthreads();  // K_j visible to all; everyone is done reading V_{j+1}
        // Only the last KV block can be partial, and it is one of the masked ones.
        if constexpr (decltype(masked)::value) {
            copy_zfill(gmem_tiled_copy, tVgV(_, _, _, n_block), tVsV, tKVcKV, binfo.seqlen_k - col0);
        } else {
            copy(gmem_tiled_copy, tVgV(_, _, _, n_block), tVsV);
        }
        cp_async_fence();

        // Line 8: S = Q K_j^T.
        gemm_ss(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_copy_q, smem_copy_k);
        if constexpr (kScoreMod) {
            // apply() tests each modification itself; this outer test still keeps the dropout kernel's
            // spills at 88 bytes (168 without it, d=128).
            if (score_mod.active()) {
                score_mod.apply(acc_s, tScS, row0, col0);
            }
        }
        if constexpr (decltype(masked)::value) {
            mask.apply(acc_s, tScS, row0, col0, mask.edges(row0, col0, kBlockM, kBlockN));
        }

        cp_async_wait<0>();
        __syncthreads();  // V_j visible to all; everyone is done reading K_j
        if (n_block > n_blocks.begin) {
            copy(gmem_tiled_copy, tKgK(_, _, _, n_block - 1), tKsK);
            cp_async_fence();
        }

        // Lines 9-10: online softmax, then O += P~ V_j with P~ kept in registers.
        softmax.update(make_tensor(acc_s.data(), rowcol(acc_s.layout())), make_tensor(acc_o.data(), rowcol(acc_o.layout())),
                       kScoreMod ? score_mod.score_scale_log2 : params.softmax_scale_log2);
        if constexpr (kDropout) {
            // The row sums above are of P~ before dropout: dropout acts on the normalized P.
            uint32_t keep[(decltype(size(acc_s))::value + 31) / 32];
            dropout_keep_bits<kBlockN>(dropout, tScS, row0, col0, keep);
            if constexpr (kDropoutMode == FwdDropout::kOnWithProbs) {
                // 32-bit offsets in the tile (the API keeps kBlockM rows of S_dmask below 2^31 entries).
                Element *tile = s_dmask + row0 * params.s_dmask_row_stride + col0;
                const int row_stride = int(params.s_dmask_row_stride);
                CUTE_UNROLL
                for (int i = 0; i < size(acc_s); ++i) {
                    const float p = is_kept(keep, i) ? acc_s(i) : -acc_s(i);
                    tile[get<0>(tScS(i)) * row_stride + get<1>(tScS(i))] = Element(p);
                }
            }
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) {
                acc_s(i) = is_kept(keep, i) ? acc_s(i) : 0.f;
            }
        }
        Tensor rP = convert_type<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), acc_as_operand_a(rP.layout()));
        gemm_rs(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, smem_copy_v);
    };

    // The KV blocks are visited from the last to the first. Those that need a mask (the seqlen_k
    // edge and the window's right edge, i.e. the causal diagonal, come first; the window's left
    // edge, below unmasked_begin, last) take one step each; the run between them goes through a
    // loop with no mask code at all. Two inlined steps, not three: a third put the accumulators in
    // local memory (a 1856-byte stack frame at d=64, NOTES run 46).
    if (n_blocks.begin < n_blocks.end) {
        const int unmasked_begin = max(n_blocks.begin, kv_block_left_edge_end(mask, row0, kBlockM, kBlockN));
        int n_block = n_blocks.end - 1;
        // Line 4, and line 7 for K of the first block.
        copy_zfill(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, binfo.seqlen_q - row0);
        copy_zfill(gmem_tiled_copy, tKgK(_, _, _, n_block), tKsK, tKVcKV, binfo.seqlen_k - n_block * kBlockN);
        cp_async_fence();
        while (n_block >= n_blocks.begin) {
            if (n_block >= unmasked_begin && !mask.needed(row0, n_block * kBlockN, kBlockM, kBlockN)) {
                for (; n_block >= unmasked_begin; --n_block) {
                    kv_step(n_block, cute::false_type{});
                }
            } else {
                kv_step(n_block, cute::true_type{});
                --n_block;
            }
        }
    }

    // Lines 12-13.
    Tensor lse = softmax.finalize(make_tensor(acc_o.data(), rowcol(acc_o.layout())),
                                  kScoreMod ? score_mod.score_scale : params.softmax_scale,
                                  kDropout ? params.dropout_scale : 1.f);

    // Lines 14-15. O goes through shared memory (Q's, unread since the last barrier) so that the
    // global stores are 16 bytes wide.
    copy_acc_to_smem<typename Traits::SmemCopyAtomAcc>(tiled_mma, convert_type<Element>(acc_o), sO, tidx);

    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(tile_qo));
    Tensor tOcO_rows = make_tensor(tOcO.data(), rowcol(tOcO.layout()));
    float *lse_rows = params.softmax_lse_ptr + binfo.lse_row0(params, bidh) + row0;
    if (get<1>(tOcO_rows(0, 0)) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < size(lse); ++r) {
            const int row = get<0>(tOcO_rows(r, 0));
            if (row < binfo.seqlen_q - row0) {
                lse_rows[row] = lse(r);
            }
        }
    }

    __syncthreads();
    copy_smem_rows_to_gmem<typename Traits::GmemTiledCopyOut>(sO, gO, binfo.seqlen_q - row0, tidx);
}

}  // namespace flash
