// Dropout (common/dropout.h) on one thread's share of a wgmma S tile: the dropped entries of P~
// set to 0 in its 16-bit registers, the A operand of O += P V.
//
// An m64nN accumulator gives a thread, in every 8-key block j, the entries (r, 8 j + 2 c + e) and
// (r + 8, 8 j + 2 c + e), e < 2, with r = 16 (warp) + lane / 4 and c = lane % 4; value index
// e + 2 h + 4 j, h the row half. Together with block j + 4 (32 keys to the right) they are the 8
// entries of one Philox call, so the thread makes each of its calls once, for itself alone. The two
// entries e = 0, 1 of a row half are one 32-bit register of P~ and one word of the call (its low and
// high half): one packed compare and one AND per register.
#pragma once

#include <cute/tensor.hpp>

#include "common/dropout.h"

namespace flash::sm90 {

using namespace cute;

// Per register of P~ (value indices 2 q and 2 q + 1, q = h + 2 j): 0xFFFF in the half of each
// entry whose number is below the threshold (DropoutRng::below_threshold), before keep_invert.
template <int kRegisters>
struct DropoutHalves {
    uint32_t below[kRegisters];
};

// Made under the GEMMs, from the Philox calls of the tile at (row0, col0); coord: partition_C of an
// identity tensor (shape ((2, 2, N / 8), 1, 1)), row0 a multiple of 16 and col0 of 64.
template <class Coord>
__device__ __forceinline__ auto dropout_halves(const DropoutRng &rng, const Coord &coord, int row0, int col0) {
    static_assert(decltype(size<0, 0>(coord))::value == 2 && decltype(size<0, 1>(coord))::value == 2 &&
                  decltype(size<1>(coord))::value == 1 && decltype(size<2>(coord))::value == 1);
    constexpr int kKeyBlocks = decltype(size<0, 2>(coord))::value;
    static_assert(kKeyBlocks % 8 == 0, "calls span 64 keys");
    DropoutHalves<2 * kKeyBlocks> halves;
    // The counters of the thread's calls differ from its first one's by constants (col0 % 64 == 0).
    const int row = row0 + get<0>(coord(0)), col = col0 + get<1>(coord(0));
    const uint64_t low = rng.counter_low(row, col), high = rng.counter_high(row);
    CUTE_UNROLL
    for (int j = 0; j < kKeyBlocks; ++j) {
        if (j & 4) {
            continue;  // the right half of a call, made with its left half
        }
        const PhiloxBits bits = rng.bits_at(low + (j / 8) * 128 + (j % 4) * 32, high);
        // word 2 h + (key half): x and y for the first row half, z and w for the second
        halves.below[2 * j] = rng.below_threshold(bits.x);
        halves.below[2 * (j + 4)] = rng.below_threshold(bits.y);
        halves.below[2 * j + 1] = rng.below_threshold(bits.z);
        halves.below[2 * (j + 4) + 1] = rng.below_threshold(bits.w);
    }
    return halves;
}

// p: P~ in 16 bits, laid out as the accumulator it was converted from.
template <int kRegisters, class P>
__device__ __forceinline__ void apply_dropout(const DropoutRng &rng, const DropoutHalves<kRegisters> &halves, P &p) {
    Tensor p32 = recast<uint32_t>(p);
    static_assert(decltype(size(p32))::value == kRegisters);
    CUTE_UNROLL
    for (int q = 0; q < kRegisters; ++q) {
        p32(q) &= halves.below[q] ^ rng.keep_invert;
    }
}

}  // namespace flash::sm90
