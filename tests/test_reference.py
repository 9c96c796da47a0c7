"""The oracle itself, against a float64 loop over rows (CPU)."""

import math

import pytest
import torch

from flash_attn_cuda.reference import attention_ref


def naive_attention(q, k, v, causal, scale):
    """Row by row in float64: out[b, i, h] = sum_j softmax_j(q_i . k_j * scale) v_j."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            hk = h // (nheads // nheads_k)
            for i in range(seqlen_q):
                last = min(seqlen_k - 1, i + seqlen_k - seqlen_q) if causal else seqlen_k - 1
                if last < 0:
                    continue
                s = (k[b, : last + 1, hk].double() @ q[b, i, h].double()) * scale
                lse[b, h, i] = torch.logsumexp(s, 0)
                out[b, i, h] = torch.softmax(s, 0) @ v[b, : last + 1, hk].double()
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (5, 9), (9, 5), (7, 7)])
@pytest.mark.parametrize("nheads,nheads_k", [(4, 4), (4, 2), (4, 1)])
def test_reference_matches_naive(causal, seqlen_q, seqlen_k, nheads, nheads_k):
    gen = torch.Generator().manual_seed(seqlen_q * 100 + seqlen_k + nheads_k)
    q = torch.randn(2, seqlen_q, nheads, 24, generator=gen)
    k = torch.randn(2, seqlen_k, nheads_k, 24, generator=gen)
    v = torch.randn(2, seqlen_k, nheads_k, 24, generator=gen)
    scale = 0.3
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale, compute_dtype=torch.float64)
    out_naive, lse_naive = naive_attention(q, k, v, causal, scale)
    torch.testing.assert_close(out.double(), out_naive, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse.double(), lse_naive, rtol=1e-6, atol=1e-6)


def test_reference_fully_masked_rows_are_zero_with_infinite_lse():
    q = torch.randn(1, 6, 2, 8)
    k = torch.randn(1, 2, 2, 8)
    out, lse = attention_ref(q, k, k, causal=True)
    # Rows 0..3 see no key (query i sees keys j <= i - 4).
    assert torch.all(out[:, :4] == 0)
    assert torch.all(lse[:, :, :4] == math.inf)
    assert torch.all(torch.isfinite(lse[:, :, 4:]))


def test_low_precision_reference_differs_from_upcast_one():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 64, 2, 32, generator=gen).to(torch.bfloat16) for _ in range(3))
    out_ref, _ = attention_ref(q, k, v)
    out_pt, _ = attention_ref(q, k, v, upcast=False)
    err = (out_pt.float() - out_ref.float()).abs().max().item()
    assert 0 < err < 0.05


def naive_variant_attention(q, k, v, scale, window, softcap, slopes, window_seqlen_k=None):
    """Row by row in float64, with the window (left, right), softcap and ALiBi slopes (nheads,) of
    flash-attn 2.x written out per key. The window is first normalized as flash-attn's C++ entry
    points do: a side >= seqlen_k (window_seqlen_k where given) is unbounded (-1), then an
    unbounded side opposite a bounded one is that length."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k = k.shape[1]
    shift = seqlen_k - seqlen_q
    bound = seqlen_k if window_seqlen_k is None else window_seqlen_k
    if window[0] >= 0 or window[1] >= 0:
        window = tuple(-1 if w >= bound else w for w in window)
        if (window[0] < 0) != (window[1] < 0):
            window = tuple(bound if w < 0 else w for w in window)
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            for i in range(seqlen_q):
                keys = [j for j in range(seqlen_k)
                        if (window[0] < 0 or j >= i + shift - window[0]) and (window[1] < 0 or j <= i + shift + window[1])]
                if not keys:
                    continue
                s = (k[b, keys, h].double() @ q[b, i, h].double()) * scale
                if softcap > 0:
                    s = softcap * torch.tanh(s / softcap)
                s = s - slopes[h].double() * torch.tensor([abs(i + shift - j) for j in keys], dtype=torch.float64)
                lse[b, h, i] = torch.logsumexp(s, 0)
                out[b, i, h] = torch.softmax(s, 0) @ v[b, keys, h].double()
    return out, lse


@pytest.mark.parametrize("window", [(-1, -1), (2, 0), (0, 3), (3, -1), (-1, 1), (1, 1), (6, 2)])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 9), (9, 5), (7, 7), (13, 4)])
@pytest.mark.parametrize("softcap,alibi", [(0.0, False), (2.0, False), (0.0, True), (3.0, True)])
def test_reference_variants_match_naive(window, seqlen_q, seqlen_k, softcap, alibi):
    gen = torch.Generator().manual_seed(seqlen_q * 10 + seqlen_k + window[0] * 7 + window[1])
    q = torch.randn(2, seqlen_q, 3, 16, generator=gen)
    k = torch.randn(2, seqlen_k, 3, 16, generator=gen)
    v = torch.randn(2, seqlen_k, 3, 16, generator=gen)
    slopes = torch.rand(3, generator=gen) if alibi else torch.zeros(3)
    out, lse = attention_ref(q, k, v, softmax_scale=0.4, window_size=window, softcap=softcap,
                             alibi_slopes=slopes if alibi else None, compute_dtype=torch.float64)
    out_naive, lse_naive = naive_variant_attention(q, k, v, 0.4, window, softcap, slopes)
    torch.testing.assert_close(out.double(), out_naive, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), lse_naive, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [(2, -1), (3, 11), (0, 6), (1, -1)])
def test_reference_window_normalized_with_a_given_seqlen_k(window):
    """One sequence of a varlen batch: flash-attn normalizes the window with max_seqlen_k (here 10),
    not with the sequence's 4 keys. The right side then ends at 10 instead of 4, which changes what
    the sequence's 13 rows see."""
    gen = torch.Generator().manual_seed(window[0] * 5 + window[1])
    q, k, v = (torch.randn(1, n, 2, 8, generator=gen) for n in (13, 4, 4))
    out, lse = attention_ref(q, k, v, softmax_scale=0.4, window_size=window, window_seqlen_k=10,
                             compute_dtype=torch.float64)
    out_naive, lse_naive = naive_variant_attention(q, k, v, 0.4, window, 0.0, torch.zeros(2), window_seqlen_k=10)
    torch.testing.assert_close(out.double(), out_naive, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), lse_naive, rtol=1e-5, atol=1e-6)
    own_out, _ = attention_ref(q, k, v, softmax_scale=0.4, window_size=window, compute_dtype=torch.float64)
    assert not torch.equal(own_out, out)


def test_reference_causal_is_window_right_zero():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, n, 2, 8, generator=gen) for n in (6, 9, 9))
    out_causal, _ = attention_ref(q, k, v, causal=True, window_size=(2, -1))
    out_window, _ = attention_ref(q, k, v, window_size=(2, 0))
    torch.testing.assert_close(out_causal, out_window, rtol=0, atol=0)
