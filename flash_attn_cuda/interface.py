"""The public functions, with the flash-attn 2.x signatures."""

import math

import torch
import torch.nn.functional as F

from flash_attn_cuda import _extension
from flash_attn_cuda.checks import check_cu_seqlens_values, check_head_dim, check_offsets
from flash_attn_cuda.head_dims import kernel_head_dim


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
    dropout_p drops attention probabilities with a Philox generator seeded from torch's CUDA
    generator (torch.manual_seed reproduces a run); the backward regenerates the same mask.
    Returns out (batch, seqlen_q, nheads, head_dim), or (out, softmax_lse, S_dmask) with
    return_attn_probs, softmax_lse being (batch, nheads, seqlen_q) float32 and S_dmask an empty
    tensor without dropout (flash-attn 2.7 on); with it, as flash-attn (for tests): (batch, nheads,
    seqlen_q and seqlen_k rounded up to 128), each visited key block's exp(scores - running max),
    negated where dropped (decode with _get_block_size_n).
    deterministic=True makes the backward pass accumulate dq in a fixed order (bitwise
    reproducible, slower); the default adds with atomics. softmax_lse carries no gradient.
    """
    return _attention(q=q, k=k, v=v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                      deterministic=deterministic, return_attn_probs=return_attn_probs)


def _attention(*, q=None, k=None, v=None, packed=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
               max_seqlen_k=0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_attn_probs, check_cu_seqlens=True):
    """Every public function's forward: the op fwd on q, k, v, or packed_fwd on q (or None) and a
    packed kv (or qkv). The ops check the tensors and options and carry the autograd
    (csrc/api/torch_ops.cpp). check_cu_seqlens=False skips the host checks of cu_seqlens (for
    offsets the caller built itself on the device)."""
    queries = q if q is not None else packed  # the tensor whose last dims are (nheads, head_dim)
    head_dim = queries.shape[-1]
    check_head_dim(head_dim)
    if cu_seqlens_q is not None and check_cu_seqlens:
        keys = k if packed is None else packed
        check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, queries.shape[0],
                                keys.shape[0])
    softmax_scale, padding = _scale_and_padding(head_dim, softmax_scale)
    if padding:
        q, k, v, packed = (None if t is None else F.pad(t, (0, padding)) for t in (q, k, v, packed))
    window_left, window_right = window_size
    # In the order of the ops' options (csrc/api/options.h), which check their values.
    options = (max_seqlen_q, max_seqlen_k, softmax_scale, bool(causal), int(window_left), int(window_right),
               float(softcap), alibi_slopes, bool(deterministic), float(dropout_p), bool(return_attn_probs))
    ops = _extension.ops()
    if packed is None:
        out, softmax_lse, _, s_dmask = ops.fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, *options)
    else:
        out, softmax_lse, _, s_dmask = ops.packed_fwd(q, packed, cu_seqlens_q, cu_seqlens_k, *options)
    if padding:
        out = out[..., :head_dim]
    if not return_attn_probs:
        return out
    return out, softmax_lse, s_dmask  # without dropout the op's empty tensor, as flash-attn 2.7 on


def _scale_and_padding(head_dim, softmax_scale):
    """softmax_scale (its default 1 / sqrt(head_dim)) and the zero features that pad head_dim to the
    kernel's head dim: zeros change neither q k^T nor the first head_dim columns of the output, which
    the caller slices back."""
    # The default stays symbolic under torch.compile(dynamic=True); a given scale is checked by the op.
    softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    return softmax_scale, kernel_head_dim(head_dim) - head_dim


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block width of the forward that wrote S_dmask (return_attn_probs with dropout): its
    entries are exp(scores - the running max over this and the later key blocks of that width).
    flash-attn's helper of the same name, for its tests' decoding."""
    del device  # dropout runs on the FA2 family on every GPU
    return _extension.load().fwd_kernel_config(kernel_head_dim(head_dim), bool(is_causal), bool(is_dropout))[1]


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
    return _attention(packed=qkv, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                      deterministic=deterministic, return_attn_probs=return_attn_probs)


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
    return _attention(q=q, packed=kv, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                      deterministic=deterministic, return_attn_probs=return_attn_probs)


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
    block_table (batch, max_blocks) int32: k and v are a paged cache (num_blocks, page_block_size,
    nheads_k, head_dim) whose sequence b holds its key j in block block_table[b, j //
    page_block_size]; the keys are gathered into packed tensors (a copy, through which the
    gradients reach the pages), which needs the offsets on the host: not under torch.compile or
    CUDA graph capture.
    """
    if block_table is not None:
        k, v = _paged_keys(k, v, block_table, cu_seqlens_k, max_seqlen_k)
    return _attention(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
                      softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs)


def _paged_keys(k, v, block_table, cu_seqlens_k, max_seqlen_k):
    """k and v of a paged cache (num_blocks, page_block_size, nheads_k, d) gathered into packed
    (total_k, nheads_k, d) by block_table, after the checks that keep the gather in bounds."""
    if torch.compiler.is_compiling() or (k.is_cuda and torch.cuda.is_current_stream_capturing()):
        raise NotImplementedError("flash_attn_varlen_func: block_table reads cu_seqlens_k on the host, which "
                                  "cannot happen under torch.compile or CUDA graph capture")
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"with block_table, k and v must be (num_blocks, page_block_size, nheads_k, head_dim) "
                         f"of one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not (isinstance(cu_seqlens_k, torch.Tensor) and cu_seqlens_k.dtype == torch.int32 and cu_seqlens_k.dim() == 1
            and cu_seqlens_k.numel() >= 1):
        raise ValueError("cu_seqlens_k must be a 1-D int32 tensor of length batch + 1")
    batch = cu_seqlens_k.shape[0] - 1
    if (block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch
            or block_table.device != k.device):
        raise ValueError(f"block_table must be int32 (batch, max_blocks) = ({batch}, ...) on k's device, got "
                         f"{tuple(block_table.shape)} {block_table.dtype} {block_table.device}")
    num_blocks, page = k.shape[:2]
    if max_seqlen_k > block_table.shape[1] * page:
        raise ValueError(f"max_seqlen_k ({max_seqlen_k}) exceeds what block_table holds ({block_table.shape[1]} "
                         f"blocks of {page})")
    total_k = int(cu_seqlens_k[-1])
    check_offsets(cu_seqlens_k, "k", total_k, max_seqlen_k)
    offsets = cu_seqlens_k.long()
    positions = torch.arange(total_k, device=k.device)
    sequence = torch.searchsorted(offsets[1:], positions, right=True)
    key = positions - offsets[sequence]
    blocks = block_table.long()[sequence, key // page]
    if not bool(((blocks >= 0) & (blocks < num_blocks)).all()):
        raise ValueError(f"block_table names blocks outside [0, {num_blocks}) for the keys of cu_seqlens_k")
    rows = blocks * page + key % page
    return k.flatten(0, 1)[rows], v.flatten(0, 1)[rows]


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
    return _attention(packed=qkv, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                      max_seqlen_k=max_seqlen, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                      deterministic=deterministic, return_attn_probs=return_attn_probs)


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
    return _attention(q=q, packed=kv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
                      softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs)
