// dK and dV of a backward tile out to global memory (Algorithm 2 line 21): each warpgroup's 64 keys
// of the (keys, head dim) accumulators, scaled, in the output's 16-bit type.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "sm90/smem_rows.h"
#include "sm90/wgmma_utils.h"

namespace flash::sm90 {

using namespace cute;

// Straight from the registers: a thread's adjacent column pairs, 4 bytes each (any row stride).
// coord: the accumulator's identity coordinates (key in the tile, column).
template <class Element, class Acc, class Coord>
__device__ __forceinline__ void store_key_rows(Acc const &acc, Coord const &coord, float scale, Element *ptr,
                                               int64_t row_stride, int key0, int seqlen_k) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // entries 2i and 2i + 1: adjacent columns of one row
        const int key = key0 + get<0>(coord(i));
        if (key < seqlen_k) {
            cutlass::NumericArrayConverter<Element, float, 2> to_element;
            const cutlass::Array<float, 2> pair{acc(i) * scale, acc(i + 1) * scale};
            *reinterpret_cast<cutlass::Array<Element, 2> *>(ptr + key * row_stride + get<1>(coord(i))) =
                to_element(pair);
        }
    }
}

// A (keys, head dim) tile of 16-bit elements in shared memory for store_key_rows_staged: warpgroup
// w's 64 keys at base + w * kRegionElems, rows of kHeadDim elements whose 16-byte chunks are XORed
// with the row (mod 8), so that neither stmatrix's 8 rows of one chunk nor a warp's reads of whole
// rows fall on a bank twice.
template <int kHeadDim, int kRegionElems, class Element>
__device__ __forceinline__ auto key_rows_staging(Element *base) {
    static_assert(kHeadDim == 64 || kHeadDim == 128);
    constexpr int kRowShift = kHeadDim == 64 ? 6 : 7;  // log2 of a row's elements
    using Rows = Layout<Shape<Shape<_64, _2>, Int<kHeadDim>>, Stride<Stride<Int<kHeadDim>, Int<kRegionElems>>, _1>>;
    return make_tensor(make_smem_ptr(base), composition(Swizzle<3, 3, kRowShift - 3>{}, Rows{}));
}

// Through shared memory: the accumulator into the staging tile by stmatrix, then each row's
// 16-byte chunks to global memory (128 contiguous bytes of a row per warp instruction, where
// store_key_rows' 4-byte stores left half of each 32-byte sector to a later instruction; they cost
// 16-24% of the short and windowed backward, run 315). acc is scaled in place. The caller has made
// the staging tile free; sync is this warpgroup's barrier. ptr and the row stride: 16-byte aligned.
template <int kHeadDim, class Element, class TiledMma, class Acc, class Staging, class Sync>
__device__ __forceinline__ void store_key_rows_staged(TiledMma const &mma, int mma_thread, Acc &acc, float scale,
                                                      Staging &staging, Sync const &sync, int warpgroup, int thread,
                                                      Element *ptr, int64_t row_stride, int key0, int seqlen_k) {
    Tensor out = make_tensor<Element>(acc.layout());
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
        acc(i) *= scale;
    }
    convert(acc, out);
    store_acc_by_stmatrix(mma, mma_thread, out, staging);
    sync();
    const int first_key = key0 + warpgroup * 64;
    Tensor rows = make_tensor(make_gmem_ptr(ptr + int64_t(first_key) * row_stride),
                              make_layout(Shape<_64, Int<kHeadDim>>{}, make_stride(row_stride, _1{})));
    copy_rows_between<Element, kHeadDim>(thread, staging(make_coord(_, warpgroup), _), rows, 0, seqlen_k - first_key);
}

}  // namespace flash::sm90
