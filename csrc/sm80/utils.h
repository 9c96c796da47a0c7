// Small CuTe helpers: register-layout views, conversions, quad reductions, tile GEMMs and
// predicated tile copies.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flash {

using namespace cute;

// An MMA accumulator ((2, 2), MMA_M, MMA_N) seen as (rows, cols) = ((2, MMA_M), (2, MMA_N)):
// of the 4 values of an m16n8 tile a thread holds, the inner pair are adjacent columns and the
// outer pair are rows r and r + 8.
template <class Layout>
__host__ __device__ constexpr auto rowcol(Layout const &acc) {
    static_assert(decltype(rank(acc))::value == 3);
    static_assert(decltype(rank<0>(acc))::value == 2);
    return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)), make_layout(get<0, 0>(acc), get<2>(acc)));
}

// The accumulator of S = Q K^T ((2, 2), MMA_M, MMA_N) seen as the A operand of P V
// ((2, 2, 2), MMA_M, MMA_N / 2): the C fragments of two adjacent n8 tiles are exactly the A
// fragment of one k16 step, so P never leaves registers.
template <class Layout>
__host__ __device__ constexpr auto acc_as_operand_a(Layout const &acc) {
    static_assert(decltype(rank(acc))::value == 3);
    static_assert(decltype(size<2>(acc))::value % 2 == 0);
    auto n_split = logical_divide(layout<2>(acc), Shape<_2>{});  // ((2, MMA_N / 2))
    return make_layout(make_layout(layout<0>(acc), layout<0, 0>(n_split)), layout<1>(acc), layout<0, 1>(n_split));
}

// Element-wise type conversion of a register tensor with packed converts (e.g. cvt.rn.bf16x2.f32).
template <typename To, class Engine, class Layout>
__device__ auto convert_type(Tensor<Engine, Layout> const &src) {
    using From = typename Engine::value_type;
    constexpr int kNumel = decltype(size(src))::value;
    Tensor dst = make_tensor<To>(src.layout());
    cutlass::NumericArrayConverter<To, From, kNumel> convert;
    *reinterpret_cast<cutlass::Array<To, kNumel> *>(dst.data()) =
        convert(*reinterpret_cast<cutlass::Array<From, kNumel> const *>(src.data()));
    return dst;
}

// acc += A B with both operands in shared memory, loaded with ldmatrix one k16 step ahead of
// the MMAs that use them. on_step(k, kSteps) runs after the MMAs of step k (other work to
// interleave with them).
template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB, class CopyA,
          class CopyB, class OnStep>
__device__ void gemm_ss(TiledMma const &tiled_mma, Acc &acc, RegA &tCrA, RegB &tCrB, SmemA const &tCsA,
                        SmemB const &tCsB, CopyA const &copy_a, CopyB const &copy_b, OnStep &&on_step) {
    Tensor tCrA_copy = copy_a.get_slice(threadIdx.x).retile_D(tCrA);
    Tensor tCrB_copy = copy_b.get_slice(threadIdx.x).retile_D(tCrB);
    constexpr int kSteps = decltype(size<2>(tCrA))::value;
    copy(copy_a, tCsA(_, _, 0), tCrA_copy(_, _, 0));
    copy(copy_b, tCsB(_, _, 0), tCrB_copy(_, _, 0));
    CUTE_UNROLL
    for (int k = 0; k < kSteps; ++k) {
        if (k + 1 < kSteps) {
            copy(copy_a, tCsA(_, _, k + 1), tCrA_copy(_, _, k + 1));
            copy(copy_b, tCsB(_, _, k + 1), tCrB_copy(_, _, k + 1));
        }
        gemm(tiled_mma, acc, tCrA(_, _, k), tCrB(_, _, k), acc);
        on_step(k, kSteps);
    }
}

template <class TiledMma, class Acc, class RegA, class RegB, class SmemA, class SmemB, class CopyA,
          class CopyB>
__device__ void gemm_ss(TiledMma const &tiled_mma, Acc &acc, RegA &tCrA, RegB &tCrB, SmemA const &tCsA,
                        SmemB const &tCsB, CopyA const &copy_a, CopyB const &copy_b) {
    gemm_ss(tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, copy_a, copy_b, [](int, int) {});
}

// acc += A B with A already in registers and B in shared memory.
template <class TiledMma, class Acc, class RegA, class RegB, class SmemB, class CopyB>
__device__ void gemm_rs(TiledMma const &tiled_mma, Acc &acc, RegA const &tCrA, RegB &tCrB, SmemB const &tCsB,
                        CopyB const &copy_b) {
    Tensor tCrB_copy = copy_b.get_slice(threadIdx.x).retile_D(tCrB);
    constexpr int kSteps = decltype(size<2>(tCrA))::value;
    copy(copy_b, tCsB(_, _, 0), tCrB_copy(_, _, 0));
    CUTE_UNROLL
    for (int k = 0; k < kSteps; ++k) {
        if (k + 1 < kSteps) {
            copy(copy_b, tCsB(_, _, k + 1), tCrB_copy(_, _, k + 1));
        }
        gemm(tiled_mma, acc, tCrA(_, _, k), tCrB(_, _, k), acc);
    }
}

// Tile copy global -> shared with cp.async; accesses whose row lies at or past max_rows write
// zeros instead of reading. coord holds each access's (row, col) in the tile, partitioned like src.
template <class TiledCopy, class Src, class Dst, class Coord>
__device__ void copy_zfill(TiledCopy const &tiled_copy, Src const &src, Dst &&dst, Coord const &coord, int max_rows) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(src); ++m) {
        const bool in_bounds = get<0>(coord(0, m, 0)) < max_rows;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(src); ++k) {
            copy(tiled_copy.with(in_bounds), src(_, m, k), dst(_, m, k));
        }
    }
}

// Tile copy registers -> global that skips the rows at or past max_rows.
template <class TiledCopy, class Src, class Dst, class Coord>
__device__ void copy_guarded(TiledCopy const &tiled_copy, Src const &src, Dst &&dst, Coord const &coord, int max_rows) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(src); ++m) {
        if (get<0>(coord(0, m, 0)) < max_rows) {
            CUTE_UNROLL
            for (int k = 0; k < size<2>(src); ++k) {
                copy(tiled_copy, src(_, m, k), dst(_, m, k));
            }
        }
    }
}

// An accumulator fragment (already converted to the element type) into a shared-memory tile, each
// thread writing its own values as the TiledMma laid them out.
template <class SmemCopyAtom, class TiledMma, class Fragment, class SmemTile>
__device__ void copy_acc_to_smem(TiledMma const &tiled_mma, Fragment const &frag, SmemTile &&tile, int tidx) {
    auto smem_copy = make_tiled_copy_C(SmemCopyAtom{}, tiled_mma);
    auto thr_copy = smem_copy.get_thread_slice(tidx);
    copy(smem_copy, thr_copy.retile_S(frag), thr_copy.partition_D(tile));
}

// A shared-memory tile out to global memory in rows of 16-byte accesses, skipping the rows at or
// past max_rows (after a barrier that made the tile visible).
template <class GmemTiledCopy, class SmemTile, class GmemTile>
__device__ void copy_smem_rows_to_gmem(SmemTile const &tile, GmemTile &&dst, int max_rows, int tidx) {
    GmemTiledCopy tiled_copy;
    auto thr_copy = tiled_copy.get_thread_slice(tidx);
    Tensor tdst = thr_copy.partition_D(dst);
    Tensor regs = make_tensor<typename std::decay_t<GmemTile>::value_type>(shape(tdst));
    copy(tiled_copy, thr_copy.partition_S(tile), regs);
    copy_guarded(tiled_copy, regs, tdst, thr_copy.partition_D(make_identity_tensor(shape(dst))), max_rows);
}

}  // namespace flash
