"""The dropout mask the kernels draw (csrc/common/dropout.h), recomputed in plain torch from a seed
and an offset, and decoded from the probabilities return_attn_probs gives: the tests' oracle."""

import math

import torch

_MASK32 = 0xFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)
_WEYL = (0x9E3779B9, 0xBB67AE85)


def _mulhilo(a, b):
    """(high, low) 32-bit halves of the constant a times each 32-bit value of b, in int64 (products
    split in 16-bit halves of b so that nothing overflows)."""
    p_lo = a * (b & 0xFFFF)
    p_hi = a * (b >> 16)
    mid = p_lo + ((p_hi & 0xFFFF) << 16)
    return ((p_hi >> 16) + (mid >> 32)) & _MASK32, mid & _MASK32


# The rounds of the mask's Philox calls (kDropoutPhiloxRounds, csrc/common/dropout.h).
MASK_PHILOX_ROUNDS = 7


def philox4x32(counter, key, rounds):
    """Philox4x32-R (Salmon et al., SC 2011) on int64 tensors holding 32-bit words: counter a
    tuple of 4 tensors, key a pair of ints; returns the 4 output words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(_MUL[0], c0)
        hi1, lo1 = _mulhilo(_MUL[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _WEYL[0]) & _MASK32, (k1 + _WEYL[1]) & _MASK32
    return c0, c1, c2, c3


def keep_count(dropout_p):
    """How many of the 2^16 16-bit numbers are kept (csrc/api/options.cpp): round((1 - p) 2^16), at
    least 1."""
    return min(max(math.floor((1.0 - dropout_p) * 65536.0 + 0.5), 1), 65536)


# The float16 bit patterns below -0: the finite negatives and -inf (csrc/common/dropout_threshold.h).
_BELOW_ZERO = 0x7C00


def _threshold_below(n):
    """The float16 bit pattern t with exactly n patterns x of half(x) < half(t) (NaNs compare false),
    or None: negative t = -m keeps the 0x7C00 - m patterns below it, positive t = m the 0x7C00 below
    zero, -0 and the m from +0 up."""
    if n <= _BELOW_ZERO:
        return 0x8000 | (_BELOW_ZERO - n)
    if _BELOW_ZERO + 2 <= n <= 2 * _BELOW_ZERO + 1:
        return n - _BELOW_ZERO - 1
    return None


def keep_rule(dropout_p):
    """(threshold, invert) of csrc/api/options.cpp: a 16-bit number u is kept iff
    (half(u) < half(threshold)) != invert, with half(x) the float16 of bit pattern x; exactly
    keep_count(p) of the 2^16 numbers are."""
    n = keep_count(dropout_p)
    t = _threshold_below(n)
    return (t, False) if t is not None else (_threshold_below(65536 - n), True)


def kept_numbers(numbers, dropout_p):
    """Which 16-bit numbers (an integer tensor of values in [0, 2^16)) keep_rule keeps."""
    threshold, invert = keep_rule(dropout_p)
    half = numbers.to(torch.int32).to(torch.int16).view(torch.float16)
    t = torch.tensor([threshold], dtype=torch.int32).to(torch.int16).view(torch.float16).to(numbers.device)
    return (half < t) != invert


def dropout_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p, device="cpu"):
    """The keep mask (batch, nheads, seqlen_q, seqlen_k), True where kept, that a forward with this
    (seed, offset) draws: one Philox call per (b, h, I, C, g, r, c) gives the 16-bit numbers of rows
    16 I + r + 8 rh, keys 64 C + 8 g + 32 kh + 2 c + e, number 4 rh + 2 kh + e (common/dropout.h)."""
    n_i, n_c = -(-seqlen_q // 16), -(-seqlen_k // 64)

    def axis(n, dim, ndim=7):
        shape = [1] * ndim
        shape[dim] = n
        return torch.arange(n, device=device, dtype=torch.int64).view(shape)

    b, h, i, c, g, r, cc = (axis(n, d) for d, n in enumerate((batch, nheads, n_i, n_c, 4, 8, 4)))
    low = offset // 4 + c * 128 + g * 32 + r * 4 + cc
    high = (b * nheads + h) * (1 << 26) + i
    shape = torch.broadcast_shapes(low.shape, high.shape)
    low, high = low.expand(shape), high.expand(shape)
    words = philox4x32((low & _MASK32, low >> 32, high & _MASK32, high >> 32),
                       (seed & _MASK32, (seed >> 32) & _MASK32), MASK_PHILOX_ROUNDS)
    # number k = 4 rh + 2 kh + e lives in word 2 rh + kh, half e: dims (b, h, I, C, g, r, c, rh, kh, e).
    stacked = torch.stack(words, dim=-1).view(*shape, 2, 2)
    numbers = torch.stack((stacked & 0xFFFF, stacked >> 16), dim=-1)
    # -> (b, h, I, rh, r, C, kh, g, c, e): rows 16 I + 8 rh + r, keys 64 C + 32 kh + 8 g + 2 c + e.
    numbers = numbers.permute(0, 1, 2, 7, 5, 3, 8, 4, 6, 9).reshape(batch, nheads, n_i * 16, n_c * 64)
    return kept_numbers(numbers, dropout_p)[:, :, :seqlen_q, :seqlen_k]


def kept_from_probs(s_dmask, seqlen_q, seqlen_k):
    """The keep mask of return_attn_probs's probabilities: dropped entries carry the sign bit."""
    return ~torch.signbit(s_dmask[:, :, :seqlen_q, :seqlen_k])
