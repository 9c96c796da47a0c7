// Philox4x32-R (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, 128 random bits from a 128-bit counter and a 64-bit key in R rounds,
// with nothing stored between calls. The constants are the paper's.
#pragma once

#include <cstdint>

namespace flash {

struct PhiloxBits {
    uint32_t x, y, z, w;
};

// The high and low words of a * b. On the device as two 32-bit products, which ptxas fuses into one
// IMAD.WIDE.U32: written as a 64-bit product, the front end carried 64-bit arithmetic through the
// round's XORs and ptxas added an integer add per product, 20 instructions more per call (a third).
__host__ __device__ __forceinline__ void mul_hi_lo(uint32_t a, uint32_t b, uint32_t &hi, uint32_t &lo) {
#ifdef __CUDA_ARCH__
    hi = __umulhi(a, b);
    lo = a * b;
#else
    const uint64_t p = uint64_t(a) * b;
    hi = uint32_t(p >> 32);
    lo = uint32_t(p);
#endif
}

template <int kRounds>
__host__ __device__ __forceinline__ PhiloxBits philox4x32(PhiloxBits ctr, uint32_t key0, uint32_t key1) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        mul_hi_lo(kMul0, ctr.x, hi0, lo0);
        mul_hi_lo(kMul1, ctr.z, hi1, lo1);
        ctr = {hi1 ^ ctr.y ^ key0, lo1, hi0 ^ ctr.w ^ key1, lo0};
        key0 += kWeyl0;
        key1 += kWeyl1;
    }
    return ctr;
}

}  // namespace flash
