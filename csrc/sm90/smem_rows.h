// A warpgroup's tile of 16-bit rows on its way out through shared memory: the accumulator in by
// stmatrix, whole 16-byte row chunks out (the forward's O, fwd_epilogue.h; the backward's dK and
// dV, bwd_key_rows_out.h).
#pragma once

#include <numeric>

#include <cute/tensor.hpp>

namespace flash::sm90 {

using namespace cute;

// regs (the accumulator's values in 16 bits, in its register layout) into dst by stmatrix: the
// accumulator's 8 x 8 tiles as they are, each tile row 8 columns that dst holds contiguous (16
// bytes). thread: this thread's index in tiled_mma.
template <class TiledMma, class Regs, class Dst>
__device__ __forceinline__ void store_acc_by_stmatrix(TiledMma const &tiled_mma, int thread, Regs const &regs,
                                                      Dst &&dst) {
    using Element = typename Regs::value_type;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma);
    auto thr = r2s.get_thread_slice(thread);
    copy(r2s, thr.retile_S(regs), thr.partition_D(dst));
}

// 16-byte row chunks of a warpgroup's (64, kHeadDim) rows spread over its 128 threads, for copies
// whose rows are predicated (copy_rows_between).
template <class Element, int kHeadDim>
using RowChunkCopy = decltype(make_tiled_copy(
    Copy_Atom<UniversalCopy<cute::uint128_t>, Element>{},
    make_layout(make_shape(Int<128 / std::gcd(kHeadDim / 8, 8)>{}, Int<std::gcd(kHeadDim / 8, 8)>{}), LayoutRight{}),
    Layout<Shape<_1, _8>>{}));

// Rows [row_begin, row_end) of a warpgroup's (64, kHeadDim) tile src (shared memory) to dst
// (global memory) in 16-byte chunks; thread: this thread's index in the warpgroup.
template <class Element, int kHeadDim, class Src, class Dst>
__device__ __forceinline__ void copy_rows_between(int thread, Src const &src, Dst &&dst, int row_begin, int row_end) {
    RowChunkCopy<Element, kHeadDim> copy_rows;
    auto thr_copy = copy_rows.get_thread_slice(thread);
    Tensor from = thr_copy.partition_S(src);
    Tensor to = thr_copy.partition_D(dst);
    Tensor coord = thr_copy.partition_D(make_identity_tensor(Shape<_64, Int<kHeadDim>>{}));
    CUTE_UNROLL
    for (int m = 0; m < size<1>(from); ++m) {
        const int row = get<0>(coord(0, m, 0));
        if (row >= row_begin && row < row_end) {
            copy(copy_rows, from(_, m, _), to(_, m, _));
        }
    }
}

}  // namespace flash::sm90
