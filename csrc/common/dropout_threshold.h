// Which 16-bit random numbers dropout keeps (plain C++, for the API code; the kernels apply it in
// common/dropout.h, flash_attn_cuda/dropout.py recomputes it).
//
// A number u is kept iff (half(u) < half(threshold)) != invert, half(x) the float16 of bit pattern x
// and NaNs comparing false: one packed float16 compare (HSET2) decides two numbers at once, where an
// integer compare takes one instruction per number and a shift per second one. Exactly keep_count of
// the 2^16 patterns are kept, so p is resolved to 2^-16 as by "u < keep_count".
#pragma once

#include <cstdint>

namespace flash {

struct DropoutThreshold {
    uint32_t threshold;  // a float16 bit pattern
    bool invert;
};

// The float16 patterns below -0: the finite negatives and -inf.
inline constexpr uint32_t kHalfPatternsBelowZero = 0x7C00;

// The pattern t with exactly n patterns x of half(x) < half(t), where one exists: -m has the
// 0x7C00 - m patterns of larger magnitude below it; +m (m >= 1) has those 0x7C00, -0, and the m
// patterns +0 .. m - 1.
constexpr bool half_threshold_below(uint32_t n, uint32_t &t) {
    if (n <= kHalfPatternsBelowZero) {
        t = 0x8000u | (kHalfPatternsBelowZero - n);
        return true;
    }
    if (n >= kHalfPatternsBelowZero + 2 && n <= 2 * kHalfPatternsBelowZero + 1) {
        t = n - kHalfPatternsBelowZero - 1;
        return true;
    }
    return false;
}

// keep_count in [1, 2^16] (the caller checks): the counts no threshold gives (0x7C01, and above
// 0x7C00 + 0x7C01, where the 2046 NaN patterns would have to be kept) are the complements of counts
// one does.
constexpr DropoutThreshold dropout_threshold(uint32_t keep_count) {
    uint32_t t = 0;
    const bool direct = half_threshold_below(keep_count, t);
    if (!direct) {
        half_threshold_below(65536u - keep_count, t);
    }
    return {t, !direct};
}

}  // namespace flash
