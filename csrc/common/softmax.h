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
    //
    // kLazyMax: m may lag the true running max by up to kMaxLagLog2 (in log2 units), so P~ <= 2^8,
    // well inside fp32's, bf16's and fp16's range. The statistics stay exact for whatever m the
    // blocks share: only when some row of the warp outgrows its m by more than the lag do the
    // warp's rows take their new max and o get rescaled. Returns whether o was rescaled (uniform
    // across the warp), so that a caller which scales O itself may skip the multiplies, one per
    // entry of O for every KV block.
    static constexpr float kMaxLagLog2 = 8.f;

    template <bool kLazyMax = false, class S, class O>
    __device__ bool update(S &&s, O &&o, float scale_log2) {
        static_assert(decltype(size<0>(s))::value == kRows);
        float block_max[kRows];
        bool outgrown = false;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            float m = row_max(r);
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                m = fmaxf(m, s(r, c));
            }
            block_max[r] = quad_allreduce(m, MaxOp{});
            // -inf to finite gives +inf (outgrown); -inf to -inf gives NaN (not outgrown).
            outgrown |= (block_max[r] - row_max(r)) * scale_log2 > kMaxLagLog2;
        }
        const bool rescale = !kLazyMax || __any_sync(0xffffffff, outgrown);
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const float m = rescale ? block_max[r] : row_max(r);
            // A row masked everywhere so far keeps m = -inf: use 0 so that exp2 gives 0, not NaN.
            const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
            float sum = 0.f;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
                sum += s(r, c);
            }
            if (rescale) {
                const float factor = exp2f(row_max(r) * scale_log2 - m_scaled);
                row_max(r) = m;
                CUTE_UNROLL
                for (int c = 0; c < size<1>(o); ++c) {
                    o(r, c) *= factor;
                }
                row_sum(r) = row_sum(r) * factor + sum;
            } else {
                row_sum(r) += sum;
            }
        }
        return rescale;
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
