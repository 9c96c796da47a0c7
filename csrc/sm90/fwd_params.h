// The Hopper forward's kernel argument: the API's parameters plus the TMA descriptors of Q, K, V
// and O, built on the host from those parameters.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "sm90/tile_scheduler.h"

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
};

// A stride the TMA accepts (16 bytes), for modes of one element, where any stride does.
constexpr int64_t kAnyValidStride = 8;

// A head or batch mode of a TMA tensor. One of a single element, or a broadcast one (stride 0,
// which the TMA cannot encode), is given one element and a valid stride; the kernel then clamps
// its coordinate there to 0 (tma_coord).
struct TmaOuterMode {
    int32_t extent;
    int64_t stride;
};
inline TmaOuterMode tma_outer_mode(int extent, int64_t stride) {
    return extent <= 1 || stride == 0 ? TmaOuterMode{1, kAnyValidStride} : TmaOuterMode{extent, stride};
}

// Where one tensor's rows are: (rows, head dim, heads, batch) with the given element strides.
struct GmemRows {
    void *ptr;
    int rows;
    int64_t row_stride, head_stride, batch_stride;
    int heads, batch;
};

template <class Traits>
auto tma_rows_layout(GmemRows const &g) {
    const TmaOuterMode h = tma_outer_mode(g.heads, g.head_stride);
    const TmaOuterMode b = tma_outer_mode(g.batch, g.batch_stride);
    const int64_t row_stride = g.rows <= 1 && g.row_stride == 0 ? kAnyValidStride : g.row_stride;
    return make_layout(typename Traits::ShapeRows{g.rows, {}, h.extent, b.extent},
                       typename Traits::StrideRows{row_stride, {}, h.stride, b.stride});
}

// V transposed: (head dim, rows, heads, batch).
template <class Traits>
auto tma_cols_layout(GmemRows const &g) {
    auto rows = tma_rows_layout<Traits>(g);
    return make_layout(typename Traits::ShapeCols{{}, get<0>(rows.shape()), get<2>(rows.shape()), get<3>(rows.shape())},
                       typename Traits::StrideCols{{}, get<0>(rows.stride()), get<2>(rows.stride()),
                                                   get<3>(rows.stride())});
}

// l2_budget_bytes: the K and V the tiles running at once should share (tile_scheduler.h).
template <class Traits>
FwdKernelParams<Traits> make_fwd_kernel_params(Flash_fwd_params const &p, int64_t l2_budget_bytes) {
    using Element = typename Traits::Element;
    const bool varlen = p.cu_seqlens_q != nullptr;
    // Varlen: the packed (total, heads, head dim) tensors, a sequence found by its row offset.
    const int batch = varlen ? 1 : p.batch;
    GmemRows q{p.q_ptr, varlen ? p.total_q : p.seqlen_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride,
               p.num_heads, batch};
    GmemRows o{p.o_ptr, q.rows, p.o_row_stride, p.o_head_stride, p.o_batch_stride, p.num_heads, batch};
    const int rows_k = varlen ? p.total_k : p.seqlen_k;
    GmemRows k{p.k_ptr, rows_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.num_heads_k, batch};
    GmemRows v{p.v_ptr, rows_k, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.num_heads_k, batch};
    if (rows_k <= 0) {
        // No keys: no K or V tile is ever loaded, but a descriptor needs a non-empty tensor.
        k = v = q;
    }

    auto lq = tma_rows_layout<Traits>(q);
    auto lk = tma_rows_layout<Traits>(k);
    auto lv = tma_cols_layout<Traits>(v);
    auto lo = tma_rows_layout<Traits>(o);
    auto gmem = [](void *ptr, auto layout) {
        return make_tensor(make_gmem_ptr(static_cast<Element const *>(ptr)), layout);
    };
    FwdKernelParams<Traits> kp{
        p,
        make_tma_copy(SM90_TMA_LOAD{}, gmem(q.ptr, lq), typename Traits::SmemLayoutQ{}),
        make_tma_copy(SM90_TMA_LOAD{}, gmem(k.ptr, lk), typename Traits::SmemLayoutK{}(_, _, _0{})),
        make_tma_copy(SM90_TMA_LOAD{}, gmem(v.ptr, lv), typename Traits::SmemLayoutVt{}(_, _, _0{})),
        make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element *>(o.ptr)), lo),
                      typename Traits::SmemLayoutO{}),
        lq.shape(),
        lk.shape(),
        lo.shape(),
        lv.shape(),
        make_tile_scheduler(ceil_div(p.seqlen_q, Traits::kBlockM), p.num_heads, p.batch,
                            // K and V of one query head: its KV head's, shared by the group.
                            int64_t(p.seqlen_k) * Traits::kHeadDim * 2 * sizeof(Element) /
                                (p.num_heads / p.num_heads_k),
                            l2_budget_bytes)};
    return kp;
}

// A head or batch coordinate in a TMA tensor whose mode may have been collapsed to one element.
template <class Extent>
__device__ __forceinline__ int tma_coord(int coord, Extent extent) {
    return min(coord, int(extent) - 1);
}

// The TMA coordinates of one head of one sequence, (rows, d) (kRowsFirst) or (d, rows): a varlen
// sequence starts at row first_row of the packed tensor.
template <bool kRowsFirst, class TmaTensor, class TmaShape>
__device__ __forceinline__ auto tma_sequence(TmaTensor const &t, TmaShape const &shape, int first_row, int head,
                                             int batch) {
    auto rows = t(_, _, tma_coord(head, get<2>(shape)), tma_coord(batch, get<3>(shape)));
    if constexpr (kRowsFirst) {
        return domain_offset(make_coord(first_row, _0{}), rows);
    } else {
        return domain_offset(make_coord(_0{}, first_row), rows);
    }
}

}  // namespace flash::sm90
