// The dropout mask of one thread's share of an S tile, for the mma.sync accumulator layout: which
// entries common/dropout.h keeps, as bits in fragment order.
//
// An m16n8 accumulator gives a thread, per 16 x 8 atom, the entries (r, 2c), (r, 2c + 1),
// (r + 8, 2c), (r + 8, 2c + 1): four of the eight of a Philox call. The call's other four are the
// same thread's in the atom 32 keys to the right (the warps split the keys in 8-wide slices
// repeating every 8 x kWarpsN, kWarpsN in {1, 2, 4}), so a thread makes each of its calls once.
#pragma once

#include <cute/tensor.hpp>

#include "common/dropout.h"

namespace flash {

using namespace cute;

// Bit i of keep[i / 32] is set iff fragment entry i is kept. coord gives the (row, col) of each
// entry in the tile at (row0, col0) (partition_C of an identity tensor, shape ((2, 2), M, N)),
// row0 a multiple of 16, col0 of 64.
template <int kBlockN, class Coord, int kWords>
__device__ __forceinline__ void dropout_keep_bits(const DropoutRng &rng, const Coord &coord, int row0, int col0,
                                                  uint32_t (&keep)[kWords]) {
    constexpr int kM = decltype(size<1>(coord))::value;
    constexpr int kN = decltype(size<2>(coord))::value;
    constexpr int kColsPerAtom = kBlockN / kN;  // 8 x the warps along N
    constexpr int kPartner = 32 / kColsPerAtom;  // the atom 32 keys to the right
    static_assert(kColsPerAtom * kN == kBlockN && 32 % kColsPerAtom == 0 && kBlockN % 64 == 0);
    static_assert(kWords * 32 >= 4 * kM * kN);
    CUTE_UNROLL
    for (int w = 0; w < kWords; ++w) {
        keep[w] = 0;
    }
    CUTE_UNROLL
    for (int m = 0; m < kM; ++m) {
        CUTE_UNROLL
        for (int n = 0; n < kN; ++n) {
            if ((n * kColsPerAtom) & 32) {
                continue;  // the right half of a call, made with its left half
            }
            const auto rc = coord(make_coord(0, 0), m, n);
            const PhiloxBits bits = rng.bits(row0 + get<0>(rc), col0 + get<1>(rc));
            CUTE_UNROLL
            for (int v = 0; v < 4; ++v) {
                const int k = (v / 2) * 4 + (v % 2);
                const int i = v + 4 * (m + kM * n), i_partner = v + 4 * (m + kM * (n + kPartner));
                keep[i / 32] |= uint32_t(rng.kept(bits, k)) << (i % 32);
                keep[i_partner / 32] |= uint32_t(rng.kept(bits, k + 2)) << (i_partner % 32);
            }
        }
    }
}

template <int kWords>
__device__ __forceinline__ bool is_kept(const uint32_t (&keep)[kWords], int i) {
    return (keep[i / 32] >> (i % 32)) & 1u;
}

}  // namespace flash
