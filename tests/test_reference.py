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
