"""Fake implementations of the extension's ops (csrc/api/torch_ops.cpp): the shapes and dtypes of
their outputs, computed on no data, with which torch.compile (and meta tensors) trace them.
Registered when _extension.load() imports this module, once the ops are defined."""

import torch


def _round_up(x, m):
    return (x + m - 1) // m * m


def _forward_like(q, k, cu_seqlens_q, options):
    """Empty (out, softmax_lse, rng_state, s_dmask) of the forward's shapes: softmax_lse (batch, nheads,
    seqlen_q), varlen (nheads, total_q); rng_state (2,) int64 with dropout; s_dmask (batch, nheads,
    seqlen_q and seqlen_k rounded up to 128) with dropout and return_softmax (csrc/api/dropout.h)."""
    max_seqlen_q, max_seqlen_k = options[0], options[1]
    dropout_p, return_softmax = options[9], options[10]
    if cu_seqlens_q is None:
        batch, seqlen_q, nheads, _ = q.shape
        seqlen_k = k.shape[1]
        lse_shape = (batch, nheads, seqlen_q)
    else:
        total_q, nheads, _ = q.shape
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
        lse_shape = (nheads, total_q)
    dropout = dropout_p > 0
    rng_state = q.new_empty((2,) if dropout else (0,), dtype=torch.int64)
    s_dmask_shape = ((batch, nheads, _round_up(seqlen_q, 128), _round_up(seqlen_k, 128))
                     if dropout and return_softmax else (0,))
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32), rng_state, q.new_empty(s_dmask_shape)


@torch.library.register_fake("flash_attn_cuda::fwd")
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, *options):
    return _forward_like(q, k, cu_seqlens_q, options)


@torch.library.register_fake("flash_attn_cuda::bwd")
def _(dout, q, k, v, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flash_attn_cuda::packed_fwd")
def _(q, packed, cu_seqlens_q, cu_seqlens_k, *options):
    parts = 3 if q is None else 2
    if packed.dim() < 3 or packed.shape[-3] != parts:
        raise ValueError(f"the packed tensor must have {parts} parts in its third dimension from the last, got "
                         f"shape {tuple(packed.shape)}")
    return _forward_like(packed.select(-3, 0) if q is None else q, packed.select(-3, parts - 2), cu_seqlens_q, options)


@torch.library.register_fake("flash_attn_cuda::packed_bwd")
def _(dout, q, packed, *rest):
    return (packed.new_empty(0) if q is None else q.new_empty(q.shape)), packed.new_empty(packed.shape)


@torch.library.register_fake("flash_attn_cuda::kvcache_layout")
def _(like, seqlens, default_seqlen, leftpad, batch, seqlen_new, capacity, rows_per_slot, rows, splits, split_align,
      total_rows, window_left, q_rows):
    offsets = batch * (splits + 1) + 2
    packed_q = like.new_empty((0,)) if q_rows is None else q_rows.new_empty((batch * splits * rows, *q_rows.shape[2:]))
    return like.new_empty((offsets,), dtype=torch.int32), like.new_empty((offsets,), dtype=torch.int32), packed_q


@torch.library.register_fake("flash_attn_cuda::kvcache_append")
def _(k_cache, v_cache, k, v, q, seqlens, slots, block_table, cos, sin, *flags):
    return q.new_empty(q.shape if cos is not None else (0,))


@torch.library.register_fake("flash_attn_cuda::kvcache_merge")
def _(out, lse, batch, splits, heads_outer, alibi_slopes, cu_seqlens_k):
    rows, (nheads, d) = out.shape[0] // (batch * splits), out.shape[1:]
    merged = out.new_empty((batch, nheads, rows, d) if heads_outer else (batch, rows, nheads, d))
    return merged.transpose(1, 2) if heads_outer else merged, lse.new_empty((nheads, batch * rows))


@torch.library.register_fake("flash_attn_cuda::kvcache_attention")
def _(q, packed_q, k_cache, v_cache, block_table, rows_per_slot, cu_seqlens_q, cu_seqlens_k, order, inverse,
      merge_slopes, splits, grouped, return_lse, *options):
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, nheads, seqlen_q) if return_lse else (0,), dtype=torch.float32)
