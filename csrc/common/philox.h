// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, 128 random bits from a 128-bit counter and a 64-bit key in ten rounds,
// with nothing stored between calls. The constants are the paper's.
#pragma once

#include <cstdint>

namespace flash {

struct PhiloxBits {
    uint32_t x, y, z, w;
};

__host__ __device__ __forceinline__ PhiloxBits philox4x32_10(PhiloxBits ctr, uint32_t key0, uint32_t key1) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = uint64_t(kMul0) * ctr.x;
        const uint64_t p1 = uint64_t(kMul1) * ctr.z;
        ctr = {uint32_t(p1 >> 32) ^ ctr.y ^ key0, uint32_t(p1), uint32_t(p0 >> 32) ^ ctr.w ^ key1, uint32_t(p0)};
        key0 += kWeyl0;
        key1 += kWeyl1;
    }
    return ctr;
}

}  // namespace flash
