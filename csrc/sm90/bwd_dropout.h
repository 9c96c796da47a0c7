// Dropout's mask (common/dropout.h) for the Hopper backward's transposed tiles.
//
// A consumer warpgroup holds S^T of its 64 keys and a 64-row Q block with the keys along wgmma's M:
// thread t gets keys r and r + 8 (r = 16 (warp) + lane / 4) and, in every 8-query block j, the
// queries 8 j + 2 c + e (c = lane % 4, e < 2), value index e + 2 h + 4 j with h the key half. The 8
// entries of one Philox call (2 queries, 4 keys) are spread over 4 threads of 2 warps, so the
// warpgroup makes its 512 calls once, 4 per thread, and trades the bits through shared memory:
// the keep bit of (key k, query q) is bit q / 8 of byte q % 8 of key k's 8 bytes. The thread that
// makes the calls (queries 16 I + r' and 16 I + r' + 8, I < 4, keys 8 g + 2 c' + {0, 1, 32, 33})
// then owns whole bytes (byte r' of its 4 keys), and a reader finds its 16 entries of key r in
// bytes 2 c and 2 c + 1 (one 16-bit load).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/dropout.h"

namespace flash::sm90 {

using namespace cute;

// One warpgroup's bytes for a 64-key, 64-query tile.
inline constexpr int kDropoutTileBytes = 64 * 8;

// The keep bits of one thread's 32 entries: 16 per key half.
struct DropoutKeep {
    uint32_t half[2];

    // Entry i of the thread's m64n64 accumulator fragment (e + 2 h + 4 j).
    // The AND in PTX: the front end would turn it into a shift, an AND and a compare per entry, where
    // ptxas makes one LOP3 with a predicate out of it.
    __device__ bool kept(int i) const {
        uint32_t bit;
        asm("and.b32 %0, %1, %2;" : "=r"(bit) : "r"(half[(i >> 1) & 1]), "r"(1u << (8 * (i & 1) + (i >> 2))));
        return bit != 0u;
    }
};

// Makes this thread's 4 calls of the tile at (row0, key0) (row0 and key0 multiples of 64) and
// stores its bytes; thread: its index in the warpgroup.
__device__ __forceinline__ void write_dropout_bytes(const DropoutRng &rng, uint8_t *bytes, int row0, int key0,
                                                    int thread) {
    const int r = thread >> 4, key = 8 * ((thread >> 2) & 3) + 2 * (thread & 3);
    const uint64_t low = rng.counter_low(row0 + r, key0 + key);
    // Per key half, the bytes of keys (key, key + 1) (+ 32 in the second half) in the low bits of
    // the word's two halves, as a call's word holds the numbers of those two keys: each word's packed
    // compare adds its two bits with one AND-OR, and keep_invert is applied once at the end.
    uint32_t byte_pairs[2] = {0, 0};
    CUTE_UNROLL
    for (int block = 0; block < 4; ++block) {
        const PhiloxBits bits = rng.bits_at(low, rng.counter_high(row0 + 16 * block + r));
        const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};  // word 2 (query half) + (key half)
        CUTE_UNROLL
        for (int w = 0; w < 4; ++w) {
            byte_pairs[w & 1] |= rng.below_threshold(words[w]) & (0x00010001u << (2 * block + (w >> 1)));
        }
    }
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
        const uint32_t pair = byte_pairs[half] ^ rng.keep_invert;  // the byte stores keep bits 0-7 and 16-23
        bytes[(key + 32 * half) * 8 + r] = uint8_t(pair);
        bytes[(key + 1 + 32 * half) * 8 + r] = uint8_t(pair >> 16);
    }
}

// The thread's bits back from the bytes; coord: the fragment's (key, query) coordinates, the
// warpgroup's keys from key0 on.
template <class Coord>
__device__ __forceinline__ DropoutKeep read_dropout_bytes(uint8_t const *bytes, Coord const &coord, int key0) {
    const int query_byte = get<1>(coord(0)) % 8;  // 2 c
    DropoutKeep keep;
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
        keep.half[h] = *reinterpret_cast<uint16_t const *>(bytes + (get<0>(coord(2 * h)) - key0) * 8 + query_byte);
    }
    return keep;
}

}  // namespace flash::sm90
