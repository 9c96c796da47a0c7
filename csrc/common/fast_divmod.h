// Division of a non-negative 31-bit integer by a divisor fixed at launch, through a multiplier
// computed on the host (Granlund and Montgomery, "Division by invariant integers using
// multiplication", 1994): with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
// n / d = (mulhi(m, n) + n) >> l for 0 <= n < 2^31 (the sum stays below 2^32). Three instructions
// where a 32-bit division is ~20 and a 64-bit one a subroutine.
#pragma once

#include <cstdint>

namespace flash {

struct FastDivmod {
    int divisor = 1;
    uint32_t multiplier = 0;
    uint32_t shift = 0;

    FastDivmod() = default;
    // 1 <= d < 2^31.
    explicit FastDivmod(int d) : divisor(d) {
        while (shift < 31 && (uint64_t(1) << shift) < uint64_t(d)) {
            ++shift;
        }
        multiplier = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d)) / uint64_t(d) + 1);
    }

    // quotient = n / divisor, remainder = n % divisor, for 0 <= n < 2^31.
    __host__ __device__ __forceinline__ void operator()(int &quotient, int &remainder, int n) const {
#if defined(__CUDA_ARCH__)
        const uint32_t high = __umulhi(multiplier, uint32_t(n));
#else
        const uint32_t high = uint32_t((uint64_t(multiplier) * uint32_t(n)) >> 32);
#endif
        quotient = int((high + uint32_t(n)) >> shift);
        remainder = n - quotient * divisor;
    }
};

}  // namespace flash
