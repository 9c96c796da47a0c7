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
    float pending_sum[kRows];  // exp_at_current_max's, until committed

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
    static constexpr float kMaxEntry = float(1 << int(kMaxLagLog2));

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

    // Lines 9-10 at the m the rows have, without the block's row max (64 FMNMX of two issue cycles
    // each per 64 scores, and two shuffles, all ahead of the first exponential): s <- exp(S - m),
    // this thread's row sums kept pending. Returns whether its entries all stay within
    // 2^kMaxLagLog2, the bound update() keeps P~ in (each row's partial sum bounds its entries,
    // which are >= 0; a NaN fails). Where it holds for every thread whose P~ goes into one O, the
    // caller commits the sums (commit_pending), which makes the step what update<kLazyMax> gives
    // for a max that did not outgrow m; else it recomputes S and calls update(). A row still at
    // m = -inf fails (its exponentials are +inf, or NaN where S is -inf too).
    template <class S>
    __device__ bool exp_at_current_max(S &&s, float scale_log2) {
        static_assert(decltype(size<0>(s))::value == kRows);
        bool within = true;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            const float m_scaled = row_max(r) * scale_log2;
            float sum = 0.f;
            CUTE_UNROLL
            for (int c = 0; c < size<1>(s); ++c) {
                s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
                sum += s(r, c);
            }
            pending_sum[r] = sum;
            within &= sum <= kMaxEntry;
        }
        return within;
    }
    __device__ void commit_pending() {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
            row_sum(r) += pending_sum[r];
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
