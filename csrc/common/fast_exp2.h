// 2^x on the FMA pipe, for a share of a softmax's exponentials where MUFU is what bounds it: the
// MUFU unit computes 16 exp2 or tanh per clock per SM on the H100, and with softcap each score takes
// one of each, twice the time the tensor cores need for S = Q K^T and O += P V at d=64 (about as
// long at d=128). The FMA pipe has 128 lanes per clock.
//
// 2^x = 2^j 2^f with j = round(x), f = x - j in [-1/2, 1/2]: j from adding 1.5 * 2^23 (the sum's low
// mantissa bits are then j), 2^f from a cubic fitted to 2^f on [-1/2, 1/2] for least maximum
// relative error (7.5e-5, below half an ulp of fp16), and 2^j added into the exponent field. x is
// clamped to -125 so that the exponent stays normal: a score 2^-125 below the row's max gives
// ~2^-125 instead of 0, so a caller must keep -inf (masked) scores away from it.
#pragma once

namespace flash {

__device__ __forceinline__ float exp2_on_fma(float x) {
    constexpr float kRoundShift = 12582912.f;  // 1.5 * 2^23
    x = fmaxf(x, -125.f);
    const float shifted = __fadd_rn(x, kRoundShift);
    const float f = __fadd_rn(x, -__fadd_rn(shifted, -kRoundShift));
    float p = fmaf(0.05517132f, f, 0.24261054f);
    p = fmaf(p, f, 0.69326097f);
    p = fmaf(p, f, 0.99992812f);
    // The low bits of shifted hold j (two's complement in the mantissa): shifted << 23 is j << 23.
    return __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
}

}  // namespace flash
