"""The plain-torch dropout mask (flash_attn_cuda.dropout) that the GPU tests compare the kernels'
with: Philox4x32 at 7 and 10 rounds against the published known-answer vectors, and the mask's
statistics and layout rules (CPU)."""

import pytest
import torch

from flash_attn_cuda import _extension
from flash_attn_cuda.dropout import (MASK_PHILOX_ROUNDS, dropout_mask, keep_count, keep_rule, kept_numbers,
                                     philox4x32)
from flash_attn_cuda.reference import attention_ref

# Random123's known-answer vectors for philox4x32: (rounds, counter, key, output).
KAT = [
    (7, (0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    (7, (0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (7, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (10, (0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (10, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("rounds,counter,key,expected", KAT)
def test_philox_known_answers(rounds, counter, key, expected):
    out = philox4x32(tuple(torch.tensor([c], dtype=torch.int64) for c in counter), key, rounds)
    assert tuple(o.item() for o in out) == expected


def test_mask_draws_seven_round_words():
    """The mask's numbers are Philox4x32-7's (the kernels' kDropoutPhiloxRounds): the call at counter
    (0, 0, 0, 0) gives rows 0 and 8, keys 0, 1, 32 and 33 of (b, h) = (0, 0) at offset 0, number
    4 (row half) + 2 (key half) + e in half e of word 2 (row half) + (key half)."""
    assert MASK_PHILOX_ROUNDS == 7
    zero = torch.zeros(1, dtype=torch.int64)
    words = philox4x32((zero, zero, zero, zero), (5, 0), 7)
    numbers = torch.tensor([(w.item() >> (16 * e)) & 0xFFFF for w in words for e in range(2)])
    mask = dropout_mask(5, 0, 1, 1, 9, 34, 0.5)[0, 0]
    entries = torch.stack([mask[row, key + e] for row in (0, 8) for key in (0, 32) for e in range(2)])
    assert torch.equal(entries, kept_numbers(numbers, 0.5))


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_kept_fraction_within_four_sigma(dropout_p):
    mask = dropout_mask(seed=1234, offset=4096, batch=2, nheads=3, seqlen_q=300, seqlen_k=517, dropout_p=dropout_p)
    n = mask.numel()
    sigma = (dropout_p * (1 - dropout_p) / n) ** 0.5
    assert abs(mask.float().mean().item() - (1 - dropout_p)) < 4 * sigma


def test_mask_is_a_function_of_position_not_of_shape():
    """An entry's bits depend on (batch, head, row, key, seed, offset) only: a larger problem holds
    the smaller one's mask in its corner; another offset or seed gives another mask."""
    small = dropout_mask(7, 0, 1, 2, 40, 70, 0.5)
    large = dropout_mask(7, 0, 1, 2, 100, 200, 0.5)
    assert torch.equal(large[:, :, :40, :70], small)
    assert not torch.equal(dropout_mask(7, 4 * 512, 1, 2, 40, 70, 0.5), small)
    assert not torch.equal(dropout_mask(8, 0, 1, 2, 40, 70, 0.5), small)


def test_keep_threshold():
    assert keep_count(0.0) == 65536 and keep_count(0.5) == 32768 and keep_count(1 - 1e-9) == 1


def test_keep_rule_keeps_exactly_keep_count_numbers():
    """For every count n of kept numbers (every p the 16 bits resolve), the float16 compare of
    keep_rule keeps exactly n of the 2^16 numbers: the kept fraction is round((1 - p) 2^16) / 2^16,
    not quantized further by the compare."""
    halves = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    for n in range(1, 65537):
        threshold, invert = keep_rule(1 - n / 65536)
        assert keep_count(1 - n / 65536) == n
        t = torch.tensor([threshold], dtype=torch.int32).to(torch.int16).view(torch.float16).float()
        below = int((halves < t).sum())
        assert (65536 - below if invert else below) == n, (n, threshold, invert)


@pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")
def test_kernels_keep_rule_is_the_oracles():
    """The (threshold, invert) that csrc/api/options.cpp hands the kernels, for every count of kept
    numbers, is the one the plain-torch mask uses; counts outside [1, 2^16] raise."""
    ext = _extension.load()
    for n in range(1, 65537):
        threshold, invert = keep_rule(1 - n / 65536)
        assert tuple(ext.dropout_threshold(n)) == (threshold, invert), n
    for bad in (0, 65537):
        with pytest.raises(ValueError):
            ext.dropout_threshold(bad)


def test_reference_with_dropout_scales_kept_probabilities():
    """With a mask keeping everything, dropout only scales the output by 1 / (1 - p)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=gen) for _ in range(3))
    out, lse = attention_ref(q, k, v)
    kept = torch.ones(1, 2, 5, 5, dtype=torch.bool)
    out_drop, lse_drop = attention_ref(q, k, v, dropout_p=0.2, dropout_mask=kept)
    torch.testing.assert_close(out_drop, out / 0.8)
    torch.testing.assert_close(lse_drop, lse)
    none_kept = torch.zeros_like(kept)
    assert attention_ref(q, k, v, dropout_p=0.2, dropout_mask=none_kept)[0].abs().max() == 0
