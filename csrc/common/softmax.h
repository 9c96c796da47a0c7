// Online softmax of Algorithm 1 (lines 9-10 and 12-13), one thread's share of the rows. Every
// family passes its accumulators seen as (rows, cols) register tensors; the 4 lanes of a quad must
// hold the same rows (true of mma.sync's m16n8 and of wgmma's m64nN accumulators).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

namespace flash {

using namespace cute;

struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// The 4 lanes of a quad hold the same accumulator rows: reduce a row statistic across them.
template <class Op>
__device__ float quad_allreduce(float x, Op op) {
    x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
    x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
    return x;
}

template <int kRows>
struct OnlineSoftmax {
    // Running max of the raw scores m and this thread's partial row sums of exp (summed across
    // the quad only at the end: the per-row rescale factor is the same in all 4 lanes).
    Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_max;
    Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_sum;

    __device__ OnlineSoftmax() {
        fill(row_max, -INFINITY);
        fill(row_sum, 0.f);
    }

    // Lines 9-10: new max m, s <- exp(S - m) (un-normalized P~), l <- e^{m_old - m} l + rowsum,
    // o <- e^{m_old - m} o. s and o are (rows, cols) views of the accumulators. scale_log2 =
    // softmax_scale * log2(e): exp(x) = exp2(x log2 e).
    template <class S, class O>
    __device__ void update(S &&s, O &&o, float scale_log2) {
        static_assert(decltype(size<0>(s))::value == kRows);
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            float m = row_max(r);
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                m = fmaxf(m, s(r, c));
            }
            m = quad_allreduce(m, MaxOp{});
            // A row masked everywhere so far keeps m = -inf: use 0 so that exp2 gives 0, not NaN.
            const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
            const float rescale = exp2f(row_max(r) * scale_log2 - m_scaled);
            row_max(r) = m;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(o); ++c) {
                o(r, c) *= rescale;
            }
            float sum = 0.f;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
                sum += s(r, c);
            }
            row_sum(r) = row_sum(r) * rescale + sum;
        }
    }

    // Lines 12-13: O <- diag(l)^-1 O and L = m * scale + log(l), o a (rows, cols) view of the
    // accumulator. Returns L per row; a row with no visible key gets O = 0 and L = +inf (then
    // exp(S - L) = 0 in the backward pass). o_scale multiplies O too (dropout's 1 / (1 - p)).
    template <class O>
    __device__ Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> finalize(O &&o, float softmax_scale,
                                                                                      float o_scale = 1.f) {
        Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> lse;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const float sum = quad_allreduce(row_sum(r), SumOp{});
            const bool empty = sum == 0.f || sum != sum;
            const float inv_sum = empty ? 1.f : o_scale / sum;
            lse(r) = empty ? INFINITY : row_max(r) * softmax_scale + logf(sum);
            CUTE_UNROLL
            for (int c = 0; c < size<1>(o); ++c) {
                o(r, c) *= inv_sum;
            }
        }
        return lse;
    }
};

}  // namespace flash
