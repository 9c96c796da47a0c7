"""flash_attn_with_kvcache, flash-attn 2.x's entry point for incremental decoding, on the varlen
forward (kvcache_layout.py): the new keys and values are rotated and written into the cache (a
csrc/kvcache kernel on the GPU), then the forward reads the cache in place."""

import functools
import math

import torch
import torch.nn.functional as F

from flash_attn_cuda.checks import check_head_dim
from flash_attn_cuda.interface import _attention, _scale_and_padding
from flash_attn_cuda import _extension
from flash_attn_cuda.kvcache_layout import (SPLIT_ALIGN, merge_splits, rows_per_slot, rows_view, sequence_offsets,
                                            total_rows)
from flash_attn_cuda.kvcache_splits import auto_splits
from flash_attn_cuda.rotary import apply_rotary

# Split-KV: the most chunks of a batch's keys that num_splits gives.
MAX_SPLITS = 16


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q over a KV cache, after appending k and v to it in place (flash-attn 2.x).

    q: (batch, seqlen_q, nheads, head_dim). k_cache, v_cache: (batch_cache, capacity, nheads_k,
    head_dim), or with block_table (batch, max_blocks) int32 a paged cache (num_blocks,
    page_block_size, nheads_k, head_dim) whose sequence b holds its token t in block
    block_table[b, t // page_block_size]. cache_seqlens: int or (batch,) int32, the cache's
    lengths (None: the whole capacity); cache_leftpad (batch,) int32: where each sequence's keys
    start in its slot (0 if None); cache_batch_idx (batch,) int32: the slot of each batch (b if
    None). Sequence b's keys are the rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new).
    k, v (batch, seqlen_new, nheads_k, head_dim): written at rows cache_seqlens[b]... of the cache,
    rotated first when rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2) are given, at positions
    cache_seqlens[b] + t; q is rotated at cache_seqlens[b] + i where causal or windowed, else all
    its rows at cache_seqlens[b]. causal, window_size, softcap, alibi_slopes as in
    flash_attn_func, aligned to the bottom-right corner (query i of seqlen_q against the
    sequence's seqlen_k keys). num_splits: chunks along the keys (split-KV; 0 picks them for the
    GPU, 1 none); it changes the speed and the rounding, not the result. No backward.
    Returns out (batch, seqlen_q, nheads, head_dim), and softmax_lse (batch, nheads, seqlen_q)
    float32 with return_softmax_lse.

    The cache lengths, offsets and block table are checked on the host (one device sync) unless
    the same tensors passed before; under torch.compile and CUDA graph capture they are not, and
    the writes and reads are clamped to the cache: bad values give wrong rows, never
    out-of-bounds accesses. There, too, cache_batch_idx's slots are gathered into a copy (slots
    that repeat cannot be ruled out without reading them).
    """
    shapes = _check_arguments(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                              cache_leftpad, block_table, alibi_slopes)
    batch, seqlen_q, nheads, head_dim = q.shape
    if batch == 0:
        out = q.new_empty(q.shape)
        return (out, out.new_empty((0, nheads, seqlen_q), dtype=torch.float32)) if return_softmax_lse else out
    capacity, seqlen_new = shapes["capacity"], shapes["seqlen_new"]
    facts = _checked_values(cache_seqlens, cache_leftpad, cache_batch_idx, block_table, shapes)
    window = _normalized_window(window_size, capacity)
    if k is not None:
        q = _appended(k_cache, v_cache, k, v, q, _per_batch(cache_seqlens, batch, q.device, None), cache_batch_idx,
                      block_table, rotary_cos, rotary_sin, rotary_interleaved, causal or window != (-1, -1), capacity)
    # One query row sees its sequence's last window_left + 1 keys, whatever the window's right side:
    # the layout keeps only those, and the rows then group and split as without a window.
    window_left = -1
    if seqlen_q == 1:
        window_left, window = window[0], (-1, -1)
    table = None
    if block_table is not None:
        used = _used_columns(block_table, k_cache.shape[1], facts["end"])
        if _pages_read_in_place(k_cache, v_cache, cache_leftpad, window_left, head_dim):
            # The kernels read a row's entries one after the other (contiguous() keeps a one-column
            # table's stride, which the op takes as it is).
            table = used if used.shape[1] == 1 or used.stride(1) == 1 else used.contiguous()
        else:
            k_cache, v_cache = (_gathered_pages(c, used) for c in (k_cache, v_cache))
    elif cache_batch_idx is not None and not facts["distinct_slots"]:
        slots = cache_batch_idx.clamp(0, k_cache.shape[0] - 1)
        k_cache, v_cache = (c.index_select(0, slots) for c in (k_cache, v_cache))
    slotted = cache_batch_idx is not None and block_table is None and facts["distinct_slots"]
    if table is None:
        k_cache, v_cache, per_slot = _rows_layout(k_cache, v_cache)
        layout_per_slot, layout_rows = per_slot, total_rows(k_cache, per_slot)
    else:
        # The op reads the pages in place (per_slot rows apart); the layout counts each batch's
        # keys in rows of its own, as gathered.
        per_slot = rows_per_slot(k_cache)
        layout_per_slot = table.shape[1] * k_cache.shape[1]
        layout_rows = batch * layout_per_slot
    longest = capacity if facts["longest"] is None else facts["longest"]
    longest = longest if window_left < 0 else min(longest, window_left + 1)

    # Decoding with GQA: each KV head's group of query heads becomes its rows (one tile per KV head).
    nheads_k = k_cache.shape[2]
    grouped = seqlen_q == 1 and nheads > nheads_k and window == (-1, -1) and alibi_slopes is None
    row_count, row_heads = (nheads // nheads_k, nheads_k) if grouped else (seqlen_q, nheads)
    causal = causal and row_count > 1 and not grouped
    splits = _splits(num_splits, batch, row_count, row_heads, q.device, longest, causal, window, alibi_slopes)
    sizes = (seqlen_new, layout_per_slot, row_count, splits, layout_rows)
    packed_q = None
    if "lengths" in facts:
        starts = facts["starts"]
        if window_left >= 0:
            starts = [max(s, n + seqlen_new - 1 - window_left) for n, s in zip(facts["lengths"], starts)]
        cu_q, cu_k, order, inverse = _host_layout(tuple(facts["lengths"]), tuple(starts),
                                                  tuple(facts["slots"]) if slotted else None, *sizes, q.device)
    else:
        # The layout kernel copies the rows where a copy is due anyway: per chunk, or where the
        # batches' rows are not one run of rows (a KV head's group of query heads, batch > 1).
        rows = _query_rows(q, grouped, nheads_k)
        copied = splits > 1 or not _one_run_of_rows(rows)
        cu_q, cu_k, packed_q = _device_layout(cache_seqlens, cache_leftpad, capacity, batch, *sizes, q.device,
                                              rows if copied else None, window_left)
        order = inverse = None
    if order is not None and alibi_slopes is not None and alibi_slopes.dim() == 2:
        alibi_slopes = alibi_slopes.index_select(0, order)
    merge_slopes = None if alibi_slopes is None or splits == 1 else alibi_slopes.contiguous()
    if alibi_slopes is not None and alibi_slopes.dim() == 2:
        # A slope row per sequence: none for those without query rows.
        per_chunk = alibi_slopes[:, None].expand(batch, splits, nheads)
        alibi_slopes = torch.cat((alibi_slopes.new_zeros(batch, 1, nheads), per_chunk), 1)
        alibi_slopes = torch.cat((alibi_slopes.reshape((splits + 1) * batch, nheads),
                                  alibi_slopes.new_zeros(1, nheads)))
    chunks = dict(packed_q=packed_q, k_cache=k_cache, v_cache=v_cache, block_table=table, per_slot=per_slot,
                  cu_q=cu_q, cu_k=cu_k, order=order, inverse=inverse, merge_slopes=merge_slopes, splits=splits,
                  grouped=grouped)
    options = dict(max_seqlen_q=row_count, max_seqlen_k=capacity, softmax_scale=softmax_scale, causal=causal,
                   window_size=window, softcap=softcap, alibi_slopes=alibi_slopes)
    out, lse = (_chunks_attention if q.is_cuda else _chunks_attention_torch)(q, chunks, options, return_softmax_lse)
    return (out, lse) if return_softmax_lse else out


def _chunks_attention(q, chunks, options, return_lse):
    """The attention of q (batch, seqlen_q, nheads, d) over the cache laid out as sequences of
    chunks (`chunks`: as _chunks_attention_torch takes them), in one op (csrc/api/kvcache_attention.cpp):
    the query rows per chunk, the forward, split-KV's merge and the outputs' shapes, each of which
    costs a few microseconds of host time as a torch call from Python. Returns out (batch,
    seqlen_q, nheads, d) and, with return_lse, softmax_lse (batch, nheads, seqlen_q)."""
    head_dim = q.shape[-1]
    softmax_scale, padding = _scale_and_padding(head_dim, options["softmax_scale"])
    packed_q, k_cache, v_cache, per_slot = chunks["packed_q"], chunks["k_cache"], chunks["v_cache"], chunks["per_slot"]
    if padding:
        # Padded as rows (a copy): one slot of them.
        k_cache, v_cache = (F.pad(rows_view(c, per_slot), (0, padding))[None] for c in (k_cache, v_cache))
        per_slot = k_cache.shape[1]
        q, packed_q = (None if t is None else F.pad(t, (0, padding)) for t in (q, packed_q))
    window_left, window_right = options["window_size"]
    out, lse = _extension.ops().kvcache_attention(
        q, packed_q, k_cache, v_cache, chunks["block_table"], per_slot, chunks["cu_q"], chunks["cu_k"], chunks["order"],
        chunks["inverse"], chunks["merge_slopes"], chunks["splits"], chunks["grouped"], return_lse,
        options["max_seqlen_q"], options["max_seqlen_k"], softmax_scale, options["causal"], window_left, window_right,
        float(options["softcap"]), options["alibi_slopes"], False, 0.0, False)
    return (out[..., :head_dim] if padding else out), lse


def _chunks_attention_torch(q, chunks, options, return_lse):
    """What the op of _chunks_attention computes, in torch (on the CPU, around the forward
    `_attention`). chunks: packed_q (batch * splits * rows, row heads, d) or None (then q's rows
    repeated per chunk), k_cache and v_cache with per_slot (read as rows, their slots per_slot rows
    apart: kvcache_layout.rows_view), the layout's cu_q and cu_k, order
    (the batches' order in the layout) and inverse or None, merge_slopes (ALiBi slopes whose
    chunks the merge shifts, or None), splits, grouped (the rows are each KV head's group of query
    heads)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    if chunks["block_table"] is None:
        keys, values = (rows_view(chunks[name], chunks["per_slot"]) for name in ("k_cache", "v_cache"))
    else:
        keys, values = (_gathered_pages(chunks[name], chunks["block_table"]).flatten(0, 1)
                        for name in ("k_cache", "v_cache"))
    splits, grouped = chunks["splits"], chunks["grouped"]
    rows = _query_rows(q, grouped, keys.shape[1])
    if chunks["order"] is not None:
        rows = rows.index_select(0, chunks["order"])
    packed_q = chunks["packed_q"]
    if packed_q is None:
        packed_q = rows[:, None].expand(-1, splits, *rows.shape[1:]).reshape(-1, *rows.shape[2:])
        if packed_q.stride(0) == 0 and packed_q.shape[0] > 1:
            # One row seen by every chunk stays a broadcast view, which the Hopper family (TMA) cannot
            # describe: the forward would fall back to the FA2 family (1.6-1.7x slower, runs 385-387).
            packed_q = packed_q.contiguous()
    with torch.no_grad():
        out, lse, _ = _attention(q=packed_q, k=keys, v=values, cu_seqlens_q=chunks["cu_q"],
                                 cu_seqlens_k=chunks["cu_k"], dropout_p=0.0, deterministic=False,
                                 return_attn_probs=True, check_cu_seqlens=False, **options)
    if splits > 1 or grouped:
        merge_alibi = None if chunks["merge_slopes"] is None else (chunks["merge_slopes"], chunks["cu_k"])
        out, lse = merge_splits(out, lse, batch, splits, heads_outer=grouped, alibi=merge_alibi)
    out = out.reshape(batch, *rows.shape[1:])
    lse = lse.reshape(lse.shape[0], batch, rows.shape[1])
    if chunks["inverse"] is not None:
        out, lse = out.index_select(0, chunks["inverse"]), lse.index_select(1, chunks["inverse"])
    if grouped:
        out = out.transpose(1, 2).reshape(batch, 1, nheads, head_dim)
    # lse (heads of the rows, batch, rows) -> (batch, nheads, seqlen_q)
    return out, (lse.permute(1, 0, 2).contiguous().view(batch, nheads, seqlen_q) if return_lse else None)


def _query_rows(q, grouped, nheads_k):
    """q's rows per batch (batch, rows, row heads, d): grouped, one decoding row's query heads as
    the rows of their KV head."""
    batch, _, nheads, head_dim = q.shape
    return q.reshape(batch, nheads_k, nheads // nheads_k, head_dim).transpose(1, 2) if grouped else q


def _check_arguments(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                     block_table, alibi_slopes):
    """The shapes and kinds of the arguments (the op checks dtypes, devices and options again);
    returns the sizes that follow from them."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {_shape(t)}")
    batch, seqlen_q, nheads, head_dim = q.shape
    check_head_dim(head_dim)
    cache_shape, dtype, device = k_cache.shape, q.dtype, q.device
    if cache_shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(cache_shape)} and "
                         f"{tuple(v_cache.shape)}")
    slots, capacity, nheads_k, cache_head_dim = cache_shape
    if cache_head_dim != head_dim:
        raise ValueError(f"k_cache's head dim must be q's ({head_dim}), got {cache_head_dim}")
    if nheads_k == 0 or nheads % nheads_k:
        raise ValueError(f"nheads ({nheads}) must be a multiple of the cache's nheads_k ({nheads_k})")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if t is not None and (t.dtype != dtype or t.device != device):
            raise ValueError(f"{name} must have q's dtype and device ({dtype}, {device}), got {t.dtype}, "
                             f"{t.device}")
    if (k is None) != (v is None):
        raise ValueError("k and v go together: give both new keys and values, or neither")
    seqlen_new = 0
    if k is not None:
        seqlen_new = k.shape[1] if k.dim() == 4 else -1
        expected = (batch, seqlen_new, nheads_k, head_dim)
        if k.dim() != 4 or tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"k and v must be (batch, seqlen_new, nheads_k, head_dim) = {expected}, got "
                             f"{_shape(k)} and {_shape(v)}")
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                    ("cache_seqlens", cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None)):
        if t is not None:
            _check_index_tensor(name, t, (batch,), device)
    if cache_seqlens is not None and not isinstance(cache_seqlens, (int, torch.Tensor)):
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor, got {type(cache_seqlens).__name__}")
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be used with block_table (a paged cache)")
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
            raise ValueError(f"block_table must be (batch, max_blocks) = ({batch}, >= 1), got {_shape(block_table)}")
        _check_index_tensor("block_table", block_table, tuple(block_table.shape), device)
        capacity *= block_table.shape[1]
    elif cache_batch_idx is None and slots < batch:
        raise ValueError(f"k_cache has {slots} slots for a batch of {batch} (give cache_batch_idx)")
    if cache_seqlens is None and k is not None:
        raise ValueError("k and v need cache_seqlens: where in the cache to write them")
    if isinstance(cache_seqlens, int) and not 0 <= cache_seqlens <= capacity - seqlen_new:
        raise ValueError(f"cache_seqlens ({cache_seqlens}) plus seqlen_new ({seqlen_new}) must be within the "
                         f"cache's capacity ({capacity})")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin go together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos / rotary_sin rotate the new keys: they need k and v")
        if (rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape or not 0 < 2 * rotary_cos.shape[1] <= head_dim
                or rotary_cos.shape[0] < capacity):
            raise ValueError(f"rotary_cos and rotary_sin must be (seqlen_ro, rotary_dim / 2) with seqlen_ro at least "
                             f"the cache's capacity ({capacity}) and rotary_dim <= head_dim ({head_dim}), got "
                             f"{_shape(rotary_cos)} and {_shape(rotary_sin)}")
        for t in (rotary_cos, rotary_sin):
            if t.dtype != dtype or t.device != device:
                raise ValueError(f"rotary_cos and rotary_sin must have q's dtype and device ({dtype}, {device}), "
                                 f"got {t.dtype}, {t.device}")
    if seqlen_new > capacity:
        raise ValueError(f"seqlen_new ({seqlen_new}) exceeds the cache's capacity ({capacity})")
    if alibi_slopes is not None and (
            not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32
            or alibi_slopes.device != device or tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads))):
        raise ValueError(f"alibi_slopes must be float32 of shape (nheads,) or (batch, nheads) = ({nheads},) or "
                         f"({batch}, {nheads}) on q's device, got {_shape(alibi_slopes)}")
    return {"capacity": capacity, "seqlen_new": seqlen_new, "slots": slots, "batch": batch,
            "cuda": device.type == "cuda"}


def _check_index_tensor(name, t, shape, device):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.shape != shape or t.device != device:
        raise ValueError(f"{name} must be an int32 tensor of shape {shape} on q's device, got "
                         f"{_shape(t)} {getattr(t, 'dtype', '')} {getattr(t, 'device', '')}")


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _per_batch(value, batch, device, default):
    """cache_seqlens or cache_leftpad as an int32 tensor (batch,)."""
    if value is None:
        value = default
    if isinstance(value, int):
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    return value


def _checked_values(cache_seqlens, cache_leftpad, cache_batch_idx, block_table, shapes):
    """Checks the values of the per-batch tensors given on the host, once per set of tensors and
    sizes (a set that passed is marked on its first tensor and not read again until one of them is
    modified in place); returns whether the slots are distinct, the most keys of a sequence and the
    last row any sequence reaches (None where not checked: under torch.compile and CUDA graph
    capture), and the values."""
    capacity, seqlen_new = shapes["capacity"], shapes["seqlen_new"]
    if torch.compiler.is_compiling() or (shapes["cuda"] and torch.cuda.is_current_stream_capturing()):
        # Repeated slots cannot be ruled out: the caller gathers the slots' rows.
        return {"distinct_slots": False, "longest": None, "end": None}
    given = [t for t in (cache_seqlens, cache_leftpad, cache_batch_idx, block_table) if isinstance(t, torch.Tensor)]
    if not given:
        length = capacity if cache_seqlens is None else cache_seqlens
        return {"distinct_slots": True, "longest": length + seqlen_new, "end": length + seqlen_new,
                "lengths": [length] * shapes["batch"], "starts": [0] * shapes["batch"], "slots": None}
    key = (tuple(None if t.is_inference() else (t._version, t.data_ptr()) for t in given),
           (capacity, seqlen_new, shapes["slots"], shapes["batch"]),
           cache_seqlens if isinstance(cache_seqlens, int) else None)
    marks = getattr(given[0], "_flash_attn_cuda_kvcache_checked", None)
    if marks is not None and None not in key[0] and key in marks:
        return marks[key]
    batch = shapes["batch"]
    lengths = _host_list(cache_seqlens, batch, capacity)
    starts = _host_list(cache_leftpad, batch, 0)
    for b, (length, start) in enumerate(zip(lengths, starts)):
        if not 0 <= length <= capacity - seqlen_new:
            raise ValueError(f"cache_seqlens[{b}] ({length}) plus seqlen_new ({seqlen_new}) must be within the "
                             f"cache's capacity ({capacity})")
        if not 0 <= start <= length:
            raise ValueError(f"cache_leftpad[{b}] ({start}) must be within [0, cache_seqlens[{b}] = {length}]")
    facts = {"distinct_slots": True, "longest": max((n + seqlen_new - s for n, s in zip(lengths, starts)), default=0),
             "end": max(lengths, default=0) + seqlen_new}
    facts["lengths"], facts["starts"], facts["slots"] = lengths, starts, None
    if cache_batch_idx is not None:
        slots = facts["slots"] = cache_batch_idx.tolist()
        if any(not 0 <= s < shapes["slots"] for s in slots):
            raise ValueError(f"cache_batch_idx must be within [0, {shapes['slots']}), got {slots}")
        facts["distinct_slots"] = len(set(slots)) == len(slots)
    if block_table is not None:
        page = capacity // block_table.shape[1]
        for b, (row, length) in enumerate(zip(block_table.tolist(), lengths)):
            used = row[: (length + seqlen_new + page - 1) // page]
            if any(not 0 <= blk < shapes["slots"] for blk in used):
                raise ValueError(f"block_table[{b}] must name blocks within [0, {shapes['slots']}) for the "
                                 f"{length + seqlen_new} tokens of sequence {b}, got {used}")
    if None not in key[0]:
        given[0]._flash_attn_cuda_kvcache_checked = {key: facts}
    return facts


def _host_list(value, batch, default):
    value = default if value is None else value
    return [value] * batch if isinstance(value, int) else value.tolist()


def _normalized_window(window_size, capacity):
    """window_size with a side at least the cache's capacity unbounded, as flash-attn's kvcache
    entry normalizes it (the op bounds an unbounded side opposite a bounded one by max_seqlen_k,
    which is the capacity here)."""
    left, right = int(window_size[0]), int(window_size[1])
    return (-1 if left >= capacity else left), (-1 if right >= capacity else right)


def _appended(k_cache, v_cache, k, v, q, seqlens, cache_batch_idx, block_table, cos, sin, interleaved, q_per_row,
              capacity):
    """Writes k and v into the caches (rotated where cos is given) and returns q (rotated where cos
    is given), the lengths clamped to the cache: in one launch on the GPU (csrc/kvcache), with
    torch on the CPU (where the tests run the layout on a stand-in forward) and for odd head dims."""
    if q.is_cuda and q.shape[-1] % 2 == 0:  # the kernel takes features in pairs
        rotated_q = _extension.ops().kvcache_append(
            k_cache, v_cache, *(t if t.stride(-1) == 1 else t.contiguous() for t in (k, v, q)), seqlens.contiguous(),
            cache_batch_idx, block_table, None if cos is None else cos.contiguous(),
            None if sin is None else sin.contiguous(), interleaved, q_per_row, capacity)
        return q if cos is None else rotated_q
    seqlens = seqlens.clamp(0, capacity - k.shape[1])
    if cos is not None:
        k, q = _rotated(k, q, cos, sin, seqlens, q_per_row, interleaved)
    _append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table, capacity)
    return q


def _rotated(k, q, cos, sin, seqlens, per_row, interleaved):
    """k rotated at positions seqlens[b] + t; q at seqlens[b] + i where per_row, else all of its
    rows at seqlens[b]."""
    steps = torch.arange(max(k.shape[1], q.shape[1]), device=k.device, dtype=seqlens.dtype)
    positions = (seqlens[:, None] + steps).clamp(max=cos.shape[0] - 1)
    q_positions = positions[:, : q.shape[1]] if per_row else positions[:, :1].expand(-1, q.shape[1])
    return (apply_rotary(k, cos, sin, positions[:, : k.shape[1]], interleaved),
            apply_rotary(q, cos, sin, q_positions, interleaved))


def _append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table, capacity):
    """Writes k, v (batch, seqlen_new, ...) at rows seqlens[b] + t of each batch's cache."""
    positions = (seqlens[:, None] + torch.arange(k.shape[1], device=k.device, dtype=seqlens.dtype)).clamp(0, capacity - 1)
    if block_table is None:
        slots = (cache_batch_idx.clamp(0, k_cache.shape[0] - 1) if cache_batch_idx is not None
                 else torch.arange(k.shape[0], device=k.device, dtype=positions.dtype))
        index = (slots[:, None].expand_as(positions), positions)
    else:
        page = k_cache.shape[1]
        blocks = block_table.long().gather(1, positions // page).clamp(0, k_cache.shape[0] - 1)
        index = (blocks, positions % page)
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def _used_columns(block_table, page, end):
    """block_table's columns up to the last row a sequence reaches (pages of `page` rows), or all
    where that is not known."""
    return block_table[:, :block_table.shape[1] if end is None else max(1, math.ceil(end / page))]


def _gathered_pages(pages, block_table):
    """A paged cache's pages per sequence, copied into (batch, blocks * page_block_size, ...) in
    the order of block_table's rows."""
    return pages[block_table.long().clamp(0, pages.shape[0] - 1)].flatten(1, 2)


def _pages_read_in_place(k_cache, v_cache, cache_leftpad, window_left, head_dim):
    """Whether the forward can read a paged cache's pages in place (else they are gathered): a
    chunk's keys must start at a multiple of kvcache_layout.SPLIT_ALIGN in its sequence, so not at
    cache_leftpad or at a sliding window's first key (window_left >= 0, one query row), and the
    pages' rows must be one view (rows_per_slot) that needs no padding of the head dim. Which page
    sizes the kernels take is the op's to decide (it gathers the others)."""
    if cache_leftpad is not None or window_left >= 0 or _scale_and_padding(head_dim, 1.0)[1]:
        return False
    page_stride = rows_per_slot(k_cache)
    return page_stride is not None and rows_per_slot(v_cache) == page_stride


@functools.lru_cache(maxsize=64)
def _host_layout(lengths, starts, slots, seqlen_new, rows_per_slot, rows, splits, total_rows, device):
    """(cu_seqlens_q, cu_seqlens_k, order, inverse) for checked host values, on the device in one
    copy and kept for the next calls with the same values (a model's layers in one decode step):
    order sorts the batches by slot (None where they are in order), inverse undoes it."""
    batch = len(lengths)
    order = sorted(range(batch), key=slots.__getitem__) if slots is not None else range(batch)
    slot = slots if slots is not None else range(batch)
    key_starts = torch.tensor([slot[b] * rows_per_slot + starts[b] for b in order])
    key_lengths = torch.tensor([lengths[b] + seqlen_new - starts[b] for b in order])
    cu_q, cu_k = sequence_offsets(key_starts, key_lengths, rows, splits, total_rows)
    parts = [cu_q, cu_k]
    if slots is not None:
        parts += [torch.tensor(order, dtype=torch.int32), torch.tensor(sorted(range(batch), key=order.__getitem__),
                                                                       dtype=torch.int32)]
    on_device = torch.cat(parts).to(device).split([len(t) for t in parts])
    return (*on_device, None, None) if slots is None else on_device


def _device_layout(cache_seqlens, cache_leftpad, capacity, batch, seqlen_new, rows_per_slot, rows, splits,
                   total_rows, device, q_rows=None, window_left=-1):
    """_host_layout's offsets, batch b in slot b, from device tensors, the values clamped
    (unchecked: under torch.compile and CUDA graph capture), and q_rows (batch, rows, nheads, d)
    copied once per chunk where given and the kernel takes it (else None: the caller packs them):
    in one launch on the GPU (csrc/kvcache), with torch on the CPU. window_left >= 0 keeps only
    each batch's last window_left + 1 keys."""
    if device.type == "cuda":
        lengths = cache_seqlens.contiguous() if isinstance(cache_seqlens, torch.Tensor) else None
        default = capacity if cache_seqlens is None else (0 if lengths is not None else cache_seqlens)
        if q_rows is not None and (q_rows.dtype not in (torch.float16, torch.bfloat16) or q_rows.stride(-1) != 1):
            q_rows = None
        cu_q, cu_k, packed_q = _extension.ops().kvcache_layout(
            torch.empty(0, device=device), lengths, default, None if cache_leftpad is None else cache_leftpad.contiguous(),
            batch, seqlen_new, capacity, rows_per_slot, rows, splits, SPLIT_ALIGN, total_rows, window_left, q_rows)
        return cu_q, cu_k, None if q_rows is None else packed_q
    lengths = _per_batch(cache_seqlens, batch, device, capacity).long().clamp(0, capacity - seqlen_new)
    starts = torch.minimum(_per_batch(cache_leftpad, batch, device, 0).long().clamp(min=0), lengths)
    if window_left >= 0:
        starts = torch.maximum(starts, lengths + seqlen_new - 1 - window_left)
    slots = torch.arange(batch, device=device)
    return (*sequence_offsets(slots * rows_per_slot + starts, lengths + seqlen_new - starts, rows, splits, total_rows),
            None)


def _one_run_of_rows(rows):
    """Whether rows (batch, rows, nheads, d) flatten to (batch * rows, nheads, d) without a copy."""
    return rows.shape[0] == 1 or rows.shape[1] == 1 or rows.stride(0) == rows.shape[1] * rows.stride(1)


def _rows_layout(k_cache, v_cache):
    """k_cache and v_cache, and how many rows apart their slots lie when read as (rows, nheads_k, d)
    tensors of one row layout (kvcache_layout.rows_per_slot): copied only where their strides do not
    allow such views."""
    per_slot = rows_per_slot(k_cache)
    if per_slot is None or rows_per_slot(v_cache) != per_slot:
        # A copy with the standard strides (contiguous() keeps a capacity-1 cache's row stride).
        k_cache, v_cache = (c.clone(memory_format=torch.contiguous_format) for c in (k_cache, v_cache))
        per_slot = k_cache.shape[1]
    return k_cache, v_cache, per_slot


def _splits(num_splits, batch, rows, heads, device, longest, causal, window, alibi_slopes):
    """How many chunks split-KV cuts each batch's keys into, for batch sequences of `rows` query
    rows over `heads` heads. A chunk sees all of its batch's query rows, so only problems whose rows
    all see every key split (no causal mask over several rows, no window, whose offsets a chunk
    would shift). ALiBi splits with one query row: a chunk's biases are then the sequence's plus a
    constant (the slope times the keys after the chunk), which the merge takes off the chunk's
    lse. num_splits=0: kvcache_splits' model."""
    if causal or window != (-1, -1) or (alibi_slopes is not None and rows > 1) or num_splits == 1 or rows == 0:
        return 1
    if num_splits > 1:
        return min(num_splits, MAX_SPLITS)
    if device.type != "cuda":
        return 1
    return auto_splits(batch, rows, heads, longest, _sm_count(device.index))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    """The device's SM count, read once (torch's query costs a few microseconds a call)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count
