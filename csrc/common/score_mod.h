// The score modifications of flash-attn 2.x, applied to a raw S = Q K^T tile (unscaled, as the
// kernels compute it) before the softmax: softcap and ALiBi. Both are runtime options, tested once
// per tile (uniform across the thread block), so the kernels without them run the code they ran
// before.
//
// Without softcap the softmax scales the tile by softmax_scale; with it the tile holds
// t = tanh(S * softmax_scale / softcap) and the softmax scales it by softcap, so that the scaled
// score is softcap * t. ALiBi's bias is added in the tile's units (divided by that scale).
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/flash.h"

namespace flash {

using namespace cute;

struct ScoreMod {
    float tanh_prescale;  // softmax_scale / softcap; 0: no softcap
    float score_scale;    // tile -> scaled score: softcap with softcap, else softmax_scale
    float alibi_slope;    // slope / score_scale; 0: no ALiBi
    float score_scale_log2;
    int causal_shift;     // seqlen_k - seqlen_q of the sequence

    __device__ ScoreMod(const Flash_fwd_params &params, int bidb, int bidh, int shift)
        : tanh_prescale(params.softcap > 0.f ? params.softmax_scale / params.softcap : 0.f),
          score_scale(params.softcap > 0.f ? params.softcap : params.softmax_scale),
          alibi_slope(params.alibi_slopes_ptr == nullptr
                          ? 0.f
                          : params.alibi_slopes_ptr[bidb * params.alibi_slopes_batch_stride + bidh] / score_scale),
          score_scale_log2(params.softcap > 0.f ? params.softcap * float(M_LOG2E) : params.softmax_scale_log2),
          causal_shift(shift) {}

    __device__ bool active() const { return tanh_prescale != 0.f || alibi_slope != 0.f; }
    __device__ bool softcapped() const { return tanh_prescale != 0.f; }

    // tanh(S * prescale), or S without softcap.
    __device__ float capped(float s) const { return softcapped() ? tanhf(s * tanh_prescale) : s; }
    // ALiBi's bias at (row, col) in the tile's units.
    __device__ float bias(int row, int col) const { return -alibi_slope * float(abs(col - row - causal_shift)); }

    // The forward: acc holds raw S; coord gives each entry's (row, col) in the tile at (row0, col0).
    // Each modification runs only where the problem has it (a branch per tile, not per entry).
    template <class Acc, class Coord>
    __device__ void apply(Acc &acc, Coord const &coord, int row0, int col0) const {
        if (softcapped()) {
            CUTE_UNROLL
            for (int i = 0; i < size(acc); ++i) {
                acc(i) = tanhf(acc(i) * tanh_prescale);
            }
        }
        add_bias(acc, coord, row0, col0);
    }

    // ALiBi's bias alone; with kTransposed, coord gives (col, row) (the Hopper backward's S^T).
    // The distance is the thread's first entry's plus the entry's compile-time offset from it, in
    // float: an entry costs an FADD and an FFMA, whose |.| operand modifier gives the absolute
    // value. Exact for distances below 2^24; beyond, it and bias() may round the distance to
    // neighbouring floats (a relative 6e-8).
    template <bool kTransposed = false, class Acc, class Coord>
    __device__ void add_bias(Acc &acc, Coord const &coord, int row0, int col0) const {
        if (alibi_slope == 0.f) {
            return;
        }
        const auto row_of = [&](int i) { return kTransposed ? get<1>(coord(i)) : get<0>(coord(i)); };
        const auto col_of = [&](int i) { return kTransposed ? get<0>(coord(i)) : get<1>(coord(i)); };
        const int row_first = row_of(0), col_first = col_of(0);
        const float distance_first = float(col0 + col_first - row0 - row_first - causal_shift);
        CUTE_UNROLL
        for (int i = 0; i < size(acc); ++i) {
            const int offset = (col_of(i) - col_first) - (row_of(i) - row_first);
            acc(i) = fmaf(-alibi_slope, fabsf(distance_first + float(offset)), acc(i));
        }
    }
};

}  // namespace flash
