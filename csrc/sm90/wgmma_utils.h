// wgmma helpers: issuing a warpgroup GEMM over the K blocks of its operands, and the register
// views of an m64nN accumulator that the softmax and the second GEMM need.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flash::sm90 {

using namespace cute;

// acc += A B (acc = A B when kZeroInit) for this thread's warpgroup, issued and committed as one
// batch; the caller waits with warpgroup_wait. A and B: (MMA, MMA_M/N, MMA_K) fragments
// (descriptors for shared memory, registers for an RS A).
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma_gemm(TiledMma &mma, TA const &a, TB const &b, TC &acc) {
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    if constexpr (kZeroInit) {
        mma.accumulate_ = GMMA::ScaleOut::Zero;
    }
    CUTE_UNROLL
    for (int k = 0; k < size<2>(a); ++k) {
        cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(acc);
}

// An m64nN fp32 accumulator ((2, 2, N/8), MMA_M, MMA_N) seen as (rows, cols): each value pair
// is 2 adjacent columns of one row, the second mode 8 rows further down, the third the next 8
// columns. The 4 lanes of a quad hold the same rows.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_rowcol(Layout const &acc) {
    auto v = get<0>(acc);
    return make_layout(make_layout(get<1>(v), get<1>(acc)), make_layout(get<0>(v), get<2>(v), get<2>(acc)));
}

// The same registers read as the A operand of a register-sourced wgmma with K = the accumulator's
// N: each k16 block of A is two consecutive n8 blocks of the accumulator, value for value.
template <class Layout>
__device__ __forceinline__ constexpr auto acc_as_operand_a(Layout const &acc) {
    auto v = get<0>(acc);
    auto n8_blocks = logical_divide(get<2>(v), Int<2>{});  // (2, N/16)
    return make_layout(make_layout(get<0>(v), get<1>(v), get<0>(n8_blocks)), get<1>(acc),
                       make_layout(get<1>(n8_blocks), get<2>(acc)));
}

// Keeps a later warpgroup_wait below the code that computes `values`. ptxas sees no dependency
// between a wgmma wait and the softmax, and schedules the wait early to fill the latency of the
// softmax's first shuffle, so the softmax would run after the P V GEMM instead of under it
// (benchmarks/sm90/NOTES.md, v1 and v6). It does not move a wait above a shared-memory store:
// storing the values to a slot of this thread's own gives the order at the cost of one STS.
// values: the 2 row statistics of a thread (an m64 accumulator gives each thread 2 rows).
template <class Values>
__device__ __forceinline__ void wait_below(Values const &values, float2 *own_slot) {
    static_assert(decltype(size(values))::value == 2);
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(own_slot))),
                 "f"(values(0)), "f"(values(1))
                 : "memory");
}

// dst = src element-wise, between register tensors of one layout (packed conversions for
// fp32 -> bf16/fp16).
template <class EngineSrc, class EngineDst, class Layout>
__device__ __forceinline__ void convert(Tensor<EngineSrc, Layout> const &src, Tensor<EngineDst, Layout> &dst) {
    using From = typename EngineSrc::value_type;
    using To = typename EngineDst::value_type;
    constexpr int N = decltype(size(src))::value;
    cutlass::NumericArrayConverter<To, From, N> converter;
    *reinterpret_cast<cutlass::Array<To, N> *>(dst.data()) =
        converter(*reinterpret_cast<cutlass::Array<From, N> const *>(src.data()));
}

}  // namespace flash::sm90
