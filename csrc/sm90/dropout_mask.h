// Dropout (common/dropout.h) on one thread's share of a wgmma S tile: the dropped entries of P~
// set to 0, in the accumulator's registers.
//
// An m64nN accumulator gives a thread, in every 8-key block j, the entries (r, 8 j + 2 c + e) and
// (r + 8, 8 j + 2 c + e), e < 2, with r = 16 (warp) + lane / 4 and c = lane % 4; value index
// e + 2 h + 4 j, h the row half. Together with block j + 4 (32 keys to the right) they are the 8
// entries of one Philox call, so the thread makes each of its calls once, for itself alone.
#pragma once

#include <cute/tensor.hpp>

#include "common/dropout.h"

namespace flash::sm90 {

using namespace cute;

// acc and coord: the accumulator and partition_C of an identity tensor (shape ((2, 2, N / 8), 1, 1));
// (row0, col0): the tile's first entry, row0 a multiple of 16 and col0 of 64.
template <class Acc, class Coord>
__device__ __forceinline__ void apply_dropout(const DropoutRng &rng, Acc &acc, const Coord &coord, int row0, int col0) {
    static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2 &&
                  decltype(size<1>(acc))::value == 1 && decltype(size<2>(acc))::value == 1);
    constexpr int kKeyBlocks = decltype(size<0, 2>(acc))::value;
    static_assert(kKeyBlocks % 8 == 0, "calls span 64 keys");
    // The counters of the thread's calls differ from its first one's by constants (col0 % 64 == 0).
    const int row = row0 + get<0>(coord(0)), col = col0 + get<1>(coord(0));
    const uint64_t low = rng.counter_low(row, col), high = rng.counter_high(row);
    CUTE_UNROLL
    for (int j = 0; j < kKeyBlocks; ++j) {
        if (j & 4) {
            continue;  // the right half of a call, made with its left half
        }
        const PhiloxBits bits = rng.bits_at(low + (j / 8) * 128 + (j % 4) * 32, high);
        CUTE_UNROLL
        for (int k = 0; k < 8; ++k) {
            // k = 4 h + 2 (key half) + e
            const int i = (k & 1) + 2 * (k >> 2) + 4 * (j + 4 * ((k >> 1) & 1));
            acc(i) = rng.kept(bits, k) ? acc(i) : 0.f;
        }
    }
}

}  // namespace flash::sm90
