// Dropout on P (flash-attn 2.x semantics): each entry of the attention matrix is kept with
// probability 1 - p and the kept ones scaled by 1 / (1 - p); the backward regenerates the same
// mask from the seed and offset the forward used (no mask is stored).
//
// Where the random bits of entry (row i, key j) of (batch b, head h) come from, independent of any
// kernel's tiling, so that every kernel (and flash_attn_cuda/dropout.py) finds the same mask:
// one Philox call gives 8 16-bit numbers to the 8 entries with
//   rows 16 I + r and 16 I + r + 8, keys 64 C + 8 g + 2 c + e and 64 C + 8 (g + 4) + 2 c + e
//   (r < 8, g < 4, c < 4, e < 2), the 16-bit number k = 4 (row half) + 2 (key half) + e;
// its counter is (offset / 4 + 128 C + 32 g + 4 r + c) in the low 64 bits and
// ((b nheads + h) 2^26 + I) in the high 64 bits, its key the seed. A forward over keys < seqlen_k
// uses the low words [offset / 4, offset / 4 + 128 ceil(seqlen_k / 64)), so it reserves
// 512 ceil(seqlen_k / 64) of torch's Philox offset (which counts 32-bit draws, 4 per counter).
// Number k is the low (k even) or high half of word k / 2 (x, y, z, w); which numbers are kept:
// common/dropout_threshold.h, two per packed float16 compare.
#pragma once

#include <cstdint>

#include "common/flash.h"
#include "common/philox.h"

namespace flash {

// Seven rounds, the fewest with which Philox4x32 passes TestU01's BigCrush (Salmon et al., Table 2;
// Random123 publishes known answers for it), as flash-attn 2.x and SDPA's flash dropout draw theirs.
// Ten (the paper's default margin) made the mask ~6.4 instructions per entry, which the forward
// pays on an SM that issues most cycles (runs 173-176, 211-214); seven make it ~4.8.
inline constexpr int kDropoutPhiloxRounds = 7;

struct DropoutRng {
    uint32_t key0, key1;
    uint64_t counter_base;  // offset / 4
    uint64_t sequence;      // (b nheads + h) 2^26
    uint32_t keep_threshold;  // params.dropout_keep_threshold: the float16 threshold in both halves
    uint32_t keep_invert;     // params.dropout_keep_invert: 0 or all ones

    // seed and offset as the forward drew them (dropout_seed_offset).
    __device__ DropoutRng(const Flash_fwd_params &params, uint64_t seed, uint64_t offset, int bidb, int bidh)
        : key0(uint32_t(seed)), key1(uint32_t(seed >> 32)), counter_base(offset / 4),
          sequence((uint64_t(bidb) * params.num_heads + bidh) << 26), keep_threshold(params.dropout_keep_threshold),
          keep_invert(params.dropout_keep_invert) {}

    // The 8 numbers of the call whose first entry is (row, col): row % 16 < 8, col % 64 < 32, even col.
    __device__ PhiloxBits bits(int row, int col) const { return bits_at(counter_low(row, col), counter_high(row)); }

    // The two halves of that call's counter; the call 64 c + 32 g keys further right has low + 128 c + 32 g.
    __device__ uint64_t counter_low(int row, int col) const {
        return counter_base + uint64_t(col >> 6) * 128 + ((col >> 3) & 3) * 32 + (row & 7) * 4 + ((col >> 1) & 3);
    }
    __device__ uint64_t counter_high(int row) const { return sequence + uint64_t(row >> 4); }
    __device__ PhiloxBits bits_at(uint64_t low, uint64_t high) const {
        return philox4x32<kDropoutPhiloxRounds>(
            {uint32_t(low), uint32_t(low >> 32), uint32_t(high), uint32_t(high >> 32)}, key0, key1);
    }

    // 0xFFFF in each half of word whose number's float16 is below the threshold: the kept halves
    // where keep_invert is 0, the dropped ones where it is all ones (the caller flips them, where it
    // costs nothing: in the instruction that applies the mask, or once per packed word).
    __device__ uint32_t below_threshold(uint32_t word) const {
        uint32_t below;
        asm("set.lt.u32.f16x2 %0, %1, %2;" : "=r"(below) : "r"(word), "r"(keep_threshold));
        return below;
    }

    // Whether entry k of a call is kept.
    __device__ bool kept(const PhiloxBits &b, int k) const {
        const uint32_t word = k < 2 ? b.x : k < 4 ? b.y : k < 6 ? b.z : b.w;
        return ((below_threshold(word) ^ keep_invert) >> (16 * (k & 1))) & 1u;
    }
};

// The seed and offset a kernel uses: the generator's values, or (under CUDA graph capture, and in
// the backward) read from device memory when the kernel runs.
__device__ __forceinline__ void dropout_seed_offset(const PhiloxSeed &philox, uint64_t &seed, uint64_t &offset) {
    if (philox.from_device) {
        seed = uint64_t(*philox.seed_ptr);
        offset = uint64_t(*philox.offset_ptr) + philox.offset_intragraph;
    } else {
        seed = philox.seed;
        offset = philox.offset;
    }
}

}  // namespace flash
