"""A KV cache seen as a varlen batch, so that flash_attn_with_kvcache runs on the varlen forward.

The cache's rows (batch_cache, capacity, nheads_k, d) are read in place as one packed tensor of
rows. Each query batch's keys are the rows [leftpad, cache_seqlens + seqlen_new) of its cache slot;
the rows between two batches' keys (the unused end of one slot, the left padding of the next)
become sequences of their own with no query rows, which the kernels skip. Split along the keys
(split-KV, for decoding batches too small to fill the GPU), a batch's keys become several
consecutive sequences that each see the batch's query rows, and merge_splits combines their
outputs by their logsumexps. On the GPU the offsets of unchecked values (CUDA graph capture) and
the merge run as kernels of their own (csrc/kvcache); the torch here is what they compute."""

import torch

from flash_attn_cuda import _extension

# Split boundaries fall on multiples of the kernels' key blocks.
SPLIT_ALIGN = 128


def rows_per_slot(cache):
    """How many rows apart cache's slots lie, so that cache reads as one (rows, nheads_k, d) tensor
    of rows without a copy (rows_view), or None where its strides do not allow it (slots not a
    whole number of rows apart, or overlapping)."""
    slots, capacity = cache.shape[:2]
    slot_stride, row_stride = cache.stride()[:2]
    if slots == 1:
        return capacity
    if row_stride > 0 and slot_stride % row_stride == 0 and slot_stride // row_stride >= capacity:
        return slot_stride // row_stride
    return None


def total_rows(cache, per_slot):
    """The rows of cache's rows view with slots per_slot rows apart."""
    return (cache.shape[0] - 1) * per_slot + cache.shape[1]


def rows_view(cache, per_slot):
    """cache (slots, capacity, nheads_k, d) as a (rows, nheads_k, d) view, its slots per_slot rows
    apart (rows_per_slot; the op kvcache_attention makes the same view in C++)."""
    stride = cache.stride()
    return cache.as_strided((total_rows(cache, per_slot), *cache.shape[2:]), stride[1:], cache.storage_offset())


def chunk_length(key_lengths, splits):
    """The keys of each of a sequence's splits chunks (an int or a tensor of them): SPLIT_ALIGN-aligned
    where split, so the last chunks may be shorter or empty."""
    chunk = (key_lengths + splits - 1) // splits
    return chunk if splits == 1 else (chunk + SPLIT_ALIGN - 1) // SPLIT_ALIGN * SPLIT_ALIGN


def sequence_offsets(key_starts, key_lengths, rows_per_batch, splits, total_rows):
    """(cu_seqlens_q, cu_seqlens_k) int32 for batches whose keys start at key_starts (increasing,
    not overlapping) with key_lengths keys each, rows_per_batch query rows each, in splits chunks:
    per batch, a sequence with no query rows that spans the rows before its keys, then its splits
    chunks (rows_per_batch query rows each); and one last such sequence up to total_rows. Chunks
    are SPLIT_ALIGN-aligned, the last ones possibly empty. The key offsets are made non-decreasing
    and kept within [0, total_rows], so that unchecked cache lengths cannot take a sequence out of
    the tensors."""
    batch = key_starts.shape[0]
    device = key_starts.device
    chunk = chunk_length(key_lengths, splits)
    ends = torch.minimum(chunk[:, None] * torch.arange(1, splits + 1, device=device), key_lengths[:, None])
    bounds = torch.cat((key_starts[:, None], key_starts[:, None] + ends), dim=1).flatten()
    zero = torch.zeros(1, dtype=bounds.dtype, device=device)
    last = torch.full((1,), total_rows, dtype=bounds.dtype, device=device)
    cu_k = torch.cat((zero, bounds, last)).clamp(0, total_rows).cummax(0).values
    chunk_ends = rows_per_batch * torch.arange(splits + 1, device=device)
    cu_q = (rows_per_batch * splits * torch.arange(batch, device=device))[:, None] + chunk_ends
    cu_q = torch.cat((zero, cu_q.flatten(), torch.full((1,), batch * splits * rows_per_batch, device=device)))
    return cu_q.to(torch.int32), cu_k.to(torch.int32)


def merge_splits(out, lse, batch, splits, heads_outer=False, alibi=None):
    """out (batch * splits * rows, nheads, d) and lse (nheads, batch * splits * rows) of the chunks
    (lse +inf where a chunk has no key for the row) -> out (batch, rows, nheads, d) in out's dtype
    and lse (nheads, batch * rows), +inf where no chunk has a key: in one launch on the GPU
    (csrc/kvcache), with torch on the CPU. heads_outer: the GPU lays out the merged out as (batch,
    nheads, rows, d) in memory (its transpose(1, 2) is then contiguous). alibi: (slopes (nheads,)
    or (batch, nheads), cu_seqlens_k of the layout) where the chunks' rows (one per sequence) had
    ALiBi relative to their chunk's last key: chunk c's lse is shifted by -slope * (the batch's keys
    after chunk c) first."""
    if out.is_cuda:
        slopes, cu_k = (None, None) if alibi is None else (alibi[0].contiguous(), alibi[1].contiguous())
        return _extension.ops().kvcache_merge(out, lse.contiguous(), batch, splits, heads_outer, slopes, cu_k)
    nheads, rows = lse.shape[0], lse.shape[1] // (batch * splits)
    chunk_out = out.reshape(batch, splits, rows, *out.shape[1:])
    chunk_lse = lse.reshape(nheads, batch, splits, rows)
    if alibi is not None:
        slopes, cu_k = alibi
        base = 1 + (splits + 1) * torch.arange(batch)
        ends = cu_k.long()[base[:, None] + torch.arange(1, splits + 1)]  # (batch, splits)
        after = ends[:, -1:] - ends
        slopes = slopes.expand(batch, nheads) if slopes.dim() == 1 else slopes
        chunk_lse = chunk_lse - (slopes.T[:, :, None] * after[None]).to(chunk_lse.dtype)[..., None]
    chunk_lse = chunk_lse.masked_fill(chunk_lse == float("inf"), float("-inf"))
    total = torch.logsumexp(chunk_lse, dim=2)  # (nheads, batch, rows)
    weights = torch.exp(chunk_lse - total[:, :, None]).nan_to_num(0.0)  # 0 for rows with no key at all
    compute = torch.promote_types(out.dtype, torch.float32)
    merged = torch.einsum("hbsr,bsrhd->brhd", weights.to(compute), chunk_out.to(compute))
    total = total.masked_fill(total == float("-inf"), float("inf"))
    return merged.to(out.dtype), total.flatten(1)
