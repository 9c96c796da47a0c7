// Algorithm 1 lines 14-15 for one tile, run by all consumer threads: O through shared memory to
// global memory, L straight from registers into softmax_lse. Without a buffer of its own, O goes
// through Q's, and the epilogue ends by handing that back to the producer.
#pragma once

#include <numeric>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "sm90/fwd_kernel_traits.h"
#include "sm90/fwd_params.h"
#include "sm90/tile_scheduler.h"
#include "sm90/wgmma_utils.h"

namespace flash::sm90 {

using namespace cute;

// 16-byte row chunks of a (kBlockM, kHeadDim) tile spread over the consumer threads, for the
// rows the TMA must not write.
template <class Traits>
using PredicatedCopyO = decltype(make_tiled_copy(
    Copy_Atom<UniversalCopy<cute::uint128_t>, typename Traits::Element>{},
    make_layout(make_shape(Int<Traits::kNumConsumerThreads / std::gcd(Traits::kHeadDim / 8, 8)>{},
                           Int<std::gcd(Traits::kHeadDim / 8, 8)>{}),
                LayoutRight{}),
    Layout<Shape<_1, _8>>{}));

template <class Traits, class AccO, class Lse, class ThrMmaO>
__device__ __forceinline__ void fwd_epilogue(FwdKernelParams<Traits> const &kp,
                                             typename Traits::SharedStorage &shared, BlockInfo const &binfo,
                                             TileCoord const &tc, AccO const &acc_o, Lse const &lse,
                                             ThrMmaO const &thr_mma_o, int ctid) {
    using Element = typename Traits::Element;
    using BlockM = typename Traits::BlockM;
    using HeadDim = typename Traits::HeadDim;
    constexpr uint32_t kEpilogueBarrier = uint32_t(FwdBarrier::kEpilogue);
    const int row0 = tc.m_block * Traits::kBlockM;
    const int rows_left = binfo.seqlen_q - row0;

    // L: the quad lane holding column 0 of a row writes it.
    Tensor cO = thr_mma_o.partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{}));
    Tensor cO_rows = make_tensor(cO.data(), acc_rowcol(cO.layout()));
    float *lse_rows = kp.params.softmax_lse_ptr + binfo.lse_row0(kp.params, tc.bidh) + row0;
    if (get<1>(cO_rows(0, 0)) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < size(lse); ++r) {
            const int row = get<0>(cO_rows(r, 0));
            if (row < rows_left) {
                lse_rows[row] = lse(r);
            }
        }
    }

    // O's buffer is free: with kSeparateO once the previous tile's TMA store has read it (the
    // thread that issued the store waits), else once every warpgroup is past its last read of Q.
    Tensor sO = make_tensor(make_smem_ptr(Traits::smem_o(shared)), typename Traits::SmemLayoutO{});
    if (Traits::kSeparateO && ctid == 0) {
        tma_store_wait<0>();
    }
    cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, kEpilogueBarrier);
    Tensor r_o = make_tensor<Element>(acc_o.layout());
    convert(acc_o, r_o);
    copy(r_o, thr_mma_o.partition_C(sO));
    cutlass::arch::fence_view_async_shared();  // the TMA store reads what st.shared wrote
    cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, kEpilogueBarrier);

    // A varlen tile that runs past its sequence's end would have the TMA write into the next
    // sequence's rows; the padded layout's tensor ends with the sequence, and the TMA clips there.
    if (!binfo.varlen || rows_left >= Traits::kBlockM) {
        if (ctid == 0) {
            Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o);
            Tensor gO = local_tile(tma_sequence<true>(mO, kp.shape_o, binfo.q_start, tc.bidh, tc.bidb),
                                   Shape<BlockM, HeadDim>{}, make_coord(tc.m_block, _0{}));
            auto [tOgO, tOsO] = tma_partition(kp.tma_o, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
            copy(kp.tma_o, tOsO, tOgO);
            tma_store_arrive();
            if constexpr (!Traits::kSeparateO) {
                tma_store_wait<0>();
            }
        }
    } else {
        Tensor gO = local_tile(binfo.q_rows<Element, Traits::kHeadDim>(kp.params.o_ptr, kp.params.o_batch_stride,
                                                                       kp.params.o_row_stride,
                                                                       kp.params.o_head_stride, tc.bidh),
                               Shape<BlockM, HeadDim>{}, make_coord(tc.m_block, _0{}));
        PredicatedCopyO<Traits> copy_o;
        auto thr_copy = copy_o.get_thread_slice(ctid);
        Tensor tOsO = thr_copy.partition_S(sO);
        Tensor tOgO = thr_copy.partition_D(gO);
        Tensor tOcO = thr_copy.partition_D(make_identity_tensor(Shape<BlockM, HeadDim>{}));
        CUTE_UNROLL
        for (int m = 0; m < size<1>(tOsO); ++m) {
            if (get<0>(tOcO(0, m, 0)) < rows_left) {
                copy(copy_o, tOsO(_, m, _), tOgO(_, m, _));
            }
        }
    }
    if constexpr (!Traits::kSeparateO) {
        // Q's buffer is free once every thread has read O out of it.
        cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, kEpilogueBarrier);
        if (ctid == 0) {
            cutlass::arch::ClusterBarrier::arrive(&shared.q_free);
        }
    }
}

}  // namespace flash::sm90
