"""attention_ref: the standard attention implementation in plain torch, the tests' oracle."""

import math

import torch


def attention_ref(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  dropout_p=0.0, dropout_mask=None, upcast=True, compute_dtype=torch.float32, window_seqlen_k=None):
    """softmax(q k^T * scale) v in the flash_attn_func layout: q (batch, seqlen_q, nheads, d),
    k/v (batch, seqlen_k, nheads_k, d), nheads a multiple of nheads_k.

    upcast=True computes in compute_dtype (float32 or float64) from the given inputs; upcast=False
    is the standard implementation in the inputs' dtype (matmuls in that dtype, softmax in
    float32 as PyTorch does it, P cast back before P v): the error baseline of the numerics rule.
    The variants follow flash-attn 2.x, with shift = seqlen_k - seqlen_q, query row i, key j:
    softcap > 0 makes the scaled score softcap * tanh(score / softcap); alibi_slopes (nheads,) or
    (batch, nheads) add -slope * |i + shift - j|; window_size (left, right) keeps the keys with
    i + shift - left <= j <= i + shift + right (-1: unbounded), causal setting right = 0, a given
    window normalized as flash-attn's C++ does it (a side >= seqlen_k is unbounded; with one side
    bounded, the unbounded other is seqlen_k: it matters only where seqlen_q > seqlen_k), with
    window_seqlen_k in place of seqlen_k where given (one sequence of a varlen batch: flash-attn
    normalizes with max_seqlen_k). A query row that sees no key gets output 0 and logsumexp +inf.
    dropout_mask (batch, nheads, seqlen_q, seqlen_k), True where kept (flash_attn_cuda.dropout),
    zeroes the other probabilities and scales the kept ones by 1 / (1 - dropout_p). Returns (out in
    q's dtype, lse float32 (batch, nheads, seqlen_q)).
    """
    dtype = q.dtype
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    groups = nheads // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    if upcast:
        q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(torch.float32 if not upcast else compute_dtype) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(scores.dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, nheads, 1, 1)
        scores = scores - slopes * _key_offsets(seqlen_q, seqlen_k, q.device).abs().to(scores.dtype)
    seen = visible(seqlen_q, seqlen_k, causal, window_size, q.device, window_seqlen_k)
    scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out.to(dtype), lse.to(torch.float32).masked_fill(lse == float("-inf"), float("inf"))


def _key_offsets(seqlen_q, seqlen_k, device):
    """(seqlen_q, seqlen_k): j - (i + seqlen_k - seqlen_q) for query row i and key j."""
    row = torch.arange(seqlen_q, device=device).view(-1, 1)
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    return col - row - (seqlen_k - seqlen_q)


def visible(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), device="cpu", window_seqlen_k=None):
    """(seqlen_q, seqlen_k) True where query row i sees key j under causal and window_size, the
    window normalized as flash-attn 2.x's C++ entry points do (a side at least window_seqlen_k wide
    is unbounded; with one side bounded, an unbounded other side is window_seqlen_k), which is
    seqlen_k unless given (varlen: max_seqlen_k)."""
    offset = _key_offsets(seqlen_q, seqlen_k, device)
    bound = seqlen_k if window_seqlen_k is None else window_seqlen_k
    left, right = window_size
    right = 0 if causal else right
    if window_size[0] >= 0 or window_size[1] >= 0:
        left, right = (-1 if left >= bound else left), (-1 if right >= bound else right)
        if left < 0 and right >= 0:
            left = bound
        elif left >= 0 and right < 0:
            right = bound
    seen = torch.ones_like(offset, dtype=torch.bool)
    if right >= 0:
        seen &= offset <= right
    if left >= 0:
        seen &= offset >= -left
    return seen
