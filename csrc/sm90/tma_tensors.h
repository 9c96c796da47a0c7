// Global tensors as the TMA sees them, for both directions: (rows, head dim, heads, batch) from the
// API's strides, and the coordinates of one sequence's head in them.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/tma_extents.h"

namespace flash::sm90 {

using namespace cute;

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

// A global tensor of Element at ptr with a layout above, as make_tma_copy takes its source.
template <class Element, class Layout>
auto tma_gmem(void *ptr, Layout const &layout) {
    return make_tensor(make_gmem_ptr(static_cast<Element *>(ptr)), layout);
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
