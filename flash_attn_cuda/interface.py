"""The public functions, with the flash-attn 2.x signatures."""

import math

import torch.nn.functional as F

from flash_attn_cuda import _extension
from flash_attn_cuda.checks import check_cu_seqlens, check_inputs, check_unbuilt_options


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Exact attention softmax(q k^T * softmax_scale) v, computed tile by tile (FlashAttention-2).

    q: (batch, seqlen_q, nheads, head_dim); k, v: (batch, seqlen_k, nheads_k, head_dim), fp16 or bf16
    on one CUDA device, nheads a multiple of nheads_k (MQA/GQA), head_dim <= 256. causal masks
    aligned to the bottom-right corner: query i sees keys j <= i + seqlen_k - seqlen_q.
    Returns out (batch, seqlen_q, nheads, head_dim), or (out, softmax_lse, None) with
    return_attn_probs, softmax_lse being (batch, nheads, seqlen_q) float32.
    deterministic=True makes the backward pass accumulate dq in a fixed order (bitwise
    reproducible, slower); the default adds with atomics. softmax_lse carries no gradient.
    """
    check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    check_inputs(q, k, v)
    return _attention((q, k, v), None, None, 0, 0, softmax_scale, causal, deterministic, return_attn_probs)


def _attention(tensors, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               deterministic, return_attn_probs):
    """The forward op (its autograd is in C++, csrc/torch_ops.cpp) on checked tensors of either
    layout: (q, k, v), or (q or None, packed kv or qkv) for the packed op. The last of them has the
    head dim last."""
    head_dim = tensors[-1].shape[-1]
    # The default needs no check, and stays symbolic under torch.compile(dynamic=True).
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    elif math.isfinite(softmax_scale) and softmax_scale > 0:
        softmax_scale = float(softmax_scale)
    else:
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    # The kernels exist for head dims 32, 64, ..., 256: pad with zeros (which change neither
    # q k^T nor the first head_dim columns of the output) and slice the output back.
    head_dim_padded = (head_dim + 31) // 32 * 32
    if head_dim_padded != head_dim:
        tensors = tuple(None if t is None else F.pad(t, (0, head_dim_padded - head_dim)) for t in tensors)
    ops = _extension.ops()
    op = ops.fwd if len(tensors) == 3 else ops.packed_fwd
    out, softmax_lse = op(
        *tensors, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, bool(causal),
        bool(deterministic),
    )
    if head_dim_padded != head_dim:
        out = out[..., :head_dim]
    return (out, softmax_lse, None) if return_attn_probs else out


def _unpack_checked(packed, parts, layout, name):
    """The views of a packed tensor of the given layout, the packed dim being the third from last."""
    if packed.dim() != layout.count(",") + 1 or packed.shape[-3] != parts:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, head_dim). The kernels read q, k, v in
    place and the backward writes the gradient of qkv as one tensor."""
    q, k, v = _unpack_checked(qkv, 3, "(batch, seqlen, 3, nheads, head_dim)", "qkv")
    check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    check_inputs(q, k, v)
    return _attention((None, qkv), None, None, 0, 0, softmax_scale, causal, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func on q (batch, seqlen_q, nheads, head_dim) and kv (batch, seqlen_k, 2,
    nheads_k, head_dim), whose gradient the backward writes as one tensor."""
    k, v = _unpack_checked(kv, 2, "(batch, seqlen_k, 2, nheads_k, head_dim)", "kv")
    check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    check_inputs(q, k, v)
    return _attention((q, kv), None, None, 0, 0, softmax_scale, causal, deterministic, return_attn_probs)


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, window_size, softcap,
                  alibi_slopes):
    check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    check_inputs(q, k, v, varlen=True)
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0], q.device)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash_attn_func on a batch of sequences of different lengths, packed without padding.

    q: (total_q, nheads, head_dim), k, v: (total_k, nheads_k, head_dim); cu_seqlens_q / cu_seqlens_k:
    int32 (batch + 1,) on the device, sequence b being the rows [cu_seqlens[b], cu_seqlens[b + 1])
    (lengths may be 0; cu_seqlens start at 0 and end at total_q / total_k); max_seqlen_q /
    max_seqlen_k: at least the longest sequence. causal is aligned to the bottom-right corner of
    each sequence. Returns out (total_q, nheads, head_dim), or (out, softmax_lse, None) with
    return_attn_probs, softmax_lse being (nheads, total_q) float32. The offsets are checked on the
    host (one device sync) except under torch.compile and CUDA graph capture.
    """
    if block_table is not None:
        raise NotImplementedError("flash_attn_cuda: block_table (paged KV cache) is not implemented yet")
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, window_size, softcap,
                  alibi_slopes)
    return _attention((q, k, v), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                      deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func on qkv (total, 3, nheads, head_dim), q, k and v sharing cu_seqlens;
    the backward writes the gradient of qkv as one tensor."""
    q, k, v = _unpack_checked(qkv, 3, "(total, 3, nheads, head_dim)", "qkv")
    _check_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, window_size, softcap,
                  alibi_slopes)
    return _attention((None, qkv), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal,
                      deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func on q (total_q, nheads, head_dim) and kv (total_k, 2, nheads_k,
    head_dim), whose gradient the backward writes as one tensor."""
    k, v = _unpack_checked(kv, 2, "(total_k, 2, nheads_k, head_dim)", "kv")
    _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, window_size, softcap,
                  alibi_slopes)
    return _attention((q, kv), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                      deterministic, return_attn_probs)
