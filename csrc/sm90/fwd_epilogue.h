// Algorithm 1 lines 14-15 for one tile, run by each consumer warpgroup on its own 64 rows: O
// through shared memory to global memory, L straight from registers into softmax_lse. O goes
// through the warpgroup's rows of the tile's Q buffer, which its last S = Q K^T has finished
// reading; the caller hands the buffer back once the store has read it. No barrier spans the
// warpgroups, so that they stay out of step (warpgroup_turns.h) from tile to tile.
//
// kOBuffer (one Q buffer): O goes through a buffer of 64 rows that warpgroup 0 and 1 take in turn,
// tile after tile: a warpgroup waits until the other's last store has read it (but warpgroup 0 in
// its first epilogue, o_buffer_first; o_phase: the phase of its OBufferTurns barrier to wait for)
// and hands it on once its own store has read it. Storing O from registers instead cost 10-20% at
// 512-1k rows (benchmarks/NOTES.md, run 204).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/block_info.h"
#include "sm90/fwd_kernel_traits.h"
#include "sm90/fwd_params.h"
#include "sm90/smem_rows.h"
#include "sm90/tile_scheduler.h"
#include "sm90/wgmma_utils.h"

namespace flash::sm90 {

using namespace cute;

template <class Traits, class AccO, class Lse, class ThrMmaO>
__device__ __forceinline__ void fwd_epilogue(FwdKernelParams<Traits> const &kp,
                                             typename Traits::SharedStorage &shared, BlockInfo const &binfo,
                                             TileCoord const &tc, int row0, AccO const &acc_o, Lse const &lse,
                                             ThrMmaO const &thr_mma_o, int ctid, int q_stage, bool o_buffer_first,
                                             int o_phase) {
    using Element = typename Traits::Element;
    using BlockM = typename Traits::BlockM;
    using HeadDim = typename Traits::HeadDim;
    using BoxCols = Int<Traits::kOBoxCols>;
    const int warpgroup = ctid / 128, wtid = ctid % 128;
    const uint32_t barrier = uint32_t(FwdBarrier::kOwnOfWarpgroup0) + warpgroup;
    const int rows_left = binfo.seqlen_q - row0;      // of the tile
    const int wg_row0 = row0 + 64 * warpgroup;         // negative above the sequence (causal_row_shift)
    const int wg_rows_left = rows_left - 64 * warpgroup;  // of this warpgroup's rows

    // L: the quad lane holding column 0 of a row of the sequence writes it.
    Tensor cO = thr_mma_o.partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{}));
    Tensor cO_rows = make_tensor(cO.data(), acc_rowcol(cO.layout()));
    float *lse_rows = kp.params.softmax_lse_ptr + binfo.lse_row0(kp.params, tc.bidh) + row0;
    if (get<1>(cO_rows(0, 0)) == 0) {
        CUTE_UNROLL
        for (int r = 0; r < size(lse); ++r) {
            const int row = get<0>(cO_rows(r, 0));
            if (row < rows_left && row >= -row0) {
                lse_rows[row] = lse(r);
            }
        }
    }

    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sO = sQ(_, _, q_stage);
    // kOBuffer's buffer (generic, so that other kernels, which have none, never instantiate it).
    auto o_buffer = [](auto &storage) {
        return make_tensor(make_smem_ptr(storage.o.data()), typename Traits::SmemLayoutO{});
    };
    // This warpgroup's 64 rows of O in shared memory.
    auto own_rows = [&] {
        if constexpr (Traits::kOBuffer) {
            return o_buffer(shared);
        } else {
            return local_tile(sO, Shape<_64, HeadDim>{}, make_coord(warpgroup, _0{}));
        }
    };
    Tensor r_o = make_tensor<Element>(acc_o.layout());
    convert(acc_o, r_o);
    // O into shared memory by stmatrix, a row's columns being contiguous in Q's K-major layout (d =
    // 128: 8 instructions per thread, where a 32-bit store per value pair took its own swizzled
    // address).
    if constexpr (Traits::kOBuffer) {
        if (!o_buffer_first) {
            cutlass::arch::ClusterBarrier::wait(&shared.o_turns.free_for[warpgroup], o_phase);
        }
        store_acc_by_stmatrix(typename Traits::TiledMmaO64{}, wtid, r_o, own_rows());
    } else {
        store_acc_by_stmatrix(typename Traits::TiledMmaO{}, ctid, r_o, sO);
    }
    cutlass::arch::fence_view_async_shared();  // the TMA store reads what st.shared wrote
    cutlass::arch::NamedBarrier::sync(128, barrier);

    // A varlen tile that runs past its sequence's end would have the TMA write into the next
    // sequence's rows; the padded layout's tensor ends with the sequence, and the TMA clips there.
    // Rows above the sequence (a negative start) make the TMA store fault (an illegal instruction,
    // run 259): those rows are left out by the copy below.
    if (wg_row0 >= 0 && (!binfo.varlen || wg_rows_left >= 64)) {
        if (wtid == 0) {
            Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_o);
            Tensor gO = local_tile(tma_sequence<true>(mO, kp.shape_o, binfo.q_start + row0, tc.bidh, tc.bidb),
                                   Shape<BlockM, HeadDim>{}, make_coord(_0{}, _0{}));
            // Q's layout stacks its swizzle atoms down the rows first: a box of 64 rows by one
            // atom's columns is contiguous.
            CUTE_UNROLL
            for (int j = 0; j < Traits::kHeadDim / Traits::kOBoxCols; ++j) {
                Tensor sBox = make_tensor(make_smem_ptr(&own_rows()(0, j * Traits::kOBoxCols)),
                                          typename Traits::SmemLayoutOBox{});
                Tensor gBox = local_tile(gO, Shape<_64, BoxCols>{}, make_coord(warpgroup, j));
                auto [tOgO, tOsO] = tma_partition(kp.tma_o, group_modes<0, 2>(sBox), group_modes<0, 2>(gBox));
                copy(kp.tma_o, tOsO, tOgO);
            }
            tma_store_arrive();
            if constexpr (Traits::kOBuffer) {
                tma_store_wait<0>();  // the store has read the buffer before it is handed on
            }
        }
    } else if (wg_rows_left > 0 && wg_row0 + 64 > 0) {
        Tensor mO = binfo.q_rows<Element, Traits::kHeadDim>(kp.params.o_ptr, kp.params.o_batch_stride,
                                                             kp.params.o_row_stride, kp.params.o_head_stride, tc.bidh);
        Tensor gO = local_tile(domain_offset(make_coord(wg_row0, _0{}), mO), Shape<_64, HeadDim>{},
                               make_coord(_0{}, _0{}));
        copy_rows_between<Element, Traits::kHeadDim>(wtid, own_rows(), gO, -wg_row0, wg_rows_left);
    }
    if constexpr (Traits::kOBuffer) {
        cutlass::arch::ClusterBarrier::arrive(&shared.o_turns.free_for[1 - warpgroup]);
    }
}

}  // namespace flash::sm90
