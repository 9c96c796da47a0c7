"""Fake implementations of the extension's ops (csrc/api/torch_ops.cpp): the shapes and dtypes of
their outputs, computed on no data, with which torch.compile (and meta tensors) trace them.
Registered when _extension.load() imports this module, once the ops are defined."""

import torch


def _forward_like(q, cu_seqlens_q):
    """Empty (out, softmax_lse) of the forward's shapes: softmax_lse (batch, nheads, seqlen_q), varlen
    (nheads, total_q)."""
    if cu_seqlens_q is None:
        batch, seqlen_q, nheads, _ = q.shape
        lse_shape = (batch, nheads, seqlen_q)
    else:
        total_q, nheads, _ = q.shape
        lse_shape = (nheads, total_q)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("flash_attn_cuda::fwd")
def _(q, k, v, cu_seqlens_q, *options):
    return _forward_like(q, cu_seqlens_q)


@torch.library.register_fake("flash_attn_cuda::bwd")
def _(dout, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flash_attn_cuda::packed_fwd")
def _(q, packed, cu_seqlens_q, *options):
    parts = 3 if q is None else 2
    if packed.dim() < 3 or packed.shape[-3] != parts:
        raise ValueError(f"the packed tensor must have {parts} parts in its third dimension from the last, got "
                         f"shape {tuple(packed.shape)}")
    return _forward_like(packed.select(-3, 0) if q is None else q, cu_seqlens_q)


@torch.library.register_fake("flash_attn_cuda::packed_bwd")
def _(dout, q, packed, *rest):
    return (packed.new_empty(0) if q is None else q.new_empty(q.shape)), packed.new_empty(packed.shape)
