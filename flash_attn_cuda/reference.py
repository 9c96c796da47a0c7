"""attention_ref: the standard attention implementation in plain torch, the tests' oracle."""

import math

import torch


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, compute_dtype=torch.float32):
    """softmax(q k^T * scale) v in the flash_attn_func layout: q (batch, seqlen_q, nheads, d),
    k/v (batch, seqlen_k, nheads_k, d), nheads a multiple of nheads_k.

    upcast=True computes in compute_dtype (float32 or float64) from the given inputs; upcast=False
    is the standard implementation in the inputs' dtype (matmuls in that dtype, softmax in
    float32 as PyTorch does it, P cast back before P v): the error baseline of the numerics rule.
    causal is aligned to the bottom-right corner; a query row that sees no key gets output 0 and
    logsumexp +inf. Returns (out in q's dtype, lse float32 (batch, nheads, seqlen_q)).
    """
    dtype = q.dtype
    seqlen_q, seqlen_k, d = q.shape[1], k.shape[1], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    if upcast:
        q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k).to(torch.float32 if not upcast else compute_dtype) * scale
    if causal:
        row = torch.arange(seqlen_q, device=q.device).view(-1, 1)
        col = torch.arange(seqlen_k, device=q.device).view(1, -1)
        scores = scores.masked_fill(col > row + seqlen_k - seqlen_q, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    return out.to(dtype), lse.to(torch.float32).masked_fill(lse == float("-inf"), float("inf"))
