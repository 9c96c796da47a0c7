// The Hopper forward's kernel argument: the API's parameters plus the TMA descriptors of Q, K, V
// and O, built on the host from those parameters.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "sm90/sequence_tensor_maps.h"
#include "sm90/tile_scheduler.h"
#include "sm90/tma_tensors.h"

namespace flash::sm90 {

using namespace cute;

template <class Traits>
struct FwdKernelParams {
    Flash_fwd_params params;
    typename Traits::TmaQ tma_q;
    typename Traits::TmaK tma_k;
    typename Traits::TmaV tma_v;
    typename Traits::TmaO tma_o;
    // The TMA tensors' shapes, for get_tma_tensor (ShapeRows: Q, K, O; ShapeCols: V).
    typename Traits::ShapeRows shape_q, shape_k, shape_o;
    typename Traits::ShapeCols shape_v;
    TileScheduler scheduler;
    // Varlen: each sequence's descriptor of V (kFwdSequenceMaps); else null. The forward needs no
    // other: rows of Q are independent, and a neighbour's keys get masked scores, replaced by -inf
    // whatever they were; only V's rows meet zeros of P in a GEMM.
    TmaDescriptor const *sequence_maps;
};

enum FwdMap { kFwdMapV };

// l2_budget_bytes: the K and V the tiles running at once should share (tile_scheduler.h).
template <class Traits>
FwdKernelParams<Traits> make_fwd_kernel_params(Flash_fwd_params const &p, int64_t l2_budget_bytes) {
    using Element = typename Traits::Element;
    const TmaRowExtents e = tma_row_extents(p);
    GmemRows q{p.q_ptr, e.rows_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.num_heads, e.batch};
    GmemRows o{p.o_ptr, e.rows_q, p.o_row_stride, p.o_head_stride, p.o_batch_stride, p.num_heads, e.batch};
    GmemRows k{p.k_ptr, e.rows_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.num_heads_k, e.batch};
    GmemRows v{p.v_ptr, e.rows_k, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.num_heads_k, e.batch};
    if (e.rows_k <= 0) {
        // No keys: no K or V tile is ever loaded (nor through the per-sequence descriptors that
        // varlen builds from these), but a descriptor needs a non-empty tensor.
        k = v = q;
    }

    auto lq = tma_rows_layout<Traits>(q);
    auto lk = tma_rows_layout<Traits>(k);
    auto lv = tma_cols_layout<Traits>(v);
    auto lo = tma_rows_layout<Traits>(o);
    FwdKernelParams<Traits> kp{
        p,
        make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element const>(q.ptr, lq), typename Traits::SmemLayoutQ{}(_, _, _0{})),
        make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element const>(k.ptr, lk), typename Traits::SmemLayoutK{}(_, _, _0{})),
        make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Element const>(v.ptr, lv), typename Traits::SmemLayoutVt{}(_, _, _0{})),
        make_tma_copy(SM90_TMA_STORE{}, tma_gmem<Element>(o.ptr, lo), typename Traits::SmemLayoutOBox{}),
        lq.shape(),
        lk.shape(),
        lo.shape(),
        lv.shape(),
        make_tile_scheduler(ceil_div(p.seqlen_q, Traits::kBlockM), p.num_heads, p.batch,
                            // K and V of one query head: its KV head's, shared by the group.
                            int64_t(p.seqlen_k) * Traits::kHeadDim * 2 * sizeof(Element) /
                                (p.num_heads / p.num_heads_k),
                            l2_budget_bytes),
        nullptr};
    return kp;
}

// Varlen: each sequence's descriptor of V, built on stream into params.fwd_workspace.
template <class Traits>
TmaDescriptor const *build_fwd_sequence_maps(FwdKernelParams<Traits> const &kp, cudaStream_t stream) {
    using Element = typename Traits::Element;
    Flash_fwd_params const &p = kp.params;
    const PackedTensor tensors[kFwdSequenceMaps] = {packed_tensor<Element>(kp.tma_v, p.v_ptr, p.v_row_stride, false)};
    return build_sequence_tensor_maps<tma_dim_of_mode<typename Traits::TmaV, 1>>(p, p.fwd_workspace, tensors, stream);
}

}  // namespace flash::sm90
