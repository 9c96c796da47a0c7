"""The public functions, with the flash-attn 2.x signatures, and the torch.library custom op."""

import math
from typing import Optional

import torch
import torch.nn.functional as F

from flash_attn_cuda import _extension

_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


# The custom ops serve the padded layout (cu_seqlens_q / cu_seqlens_k None) and the varlen one.
@torch.library.custom_op("flash_attn_cuda::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """deterministic is only recorded for the backward pass."""
    q, k, v = (_aligned(t) for t in (q, k, v))
    out, softmax_lse = _extension.load().fwd(
        q, k, v, None, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    return out, softmax_lse


@_flash_attn_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic):
    if cu_seqlens_q is None:
        batch, seqlen_q, nheads, _ = q.shape
        lse_shape = (batch, nheads, seqlen_q)
    else:
        total_q, nheads, _ = q.shape
        lse_shape = (nheads, total_q)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("flash_attn_cuda::_flash_attn_backward", mutates_args=())
def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dout, q, k, v, out = (_aligned(t) for t in (dout, q, k, v, out))
    dq, dk, dv = _extension.load().bwd(
        dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k,
    )
    return dq, dk, dv


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _aligned(t):
    """The kernels move 16 bytes at a time along a contiguous last dim: copy a tensor whose data,
    strides or last dim do not allow it."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic = inputs
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k)
    ctx.max_seqlen_q = max_seqlen_q
    ctx.max_seqlen_k = max_seqlen_k
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(softmax_lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = _flash_attn_backward(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_q, ctx.max_seqlen_k,
        ctx.softmax_scale, ctx.causal, ctx.deterministic,
    )
    return dq, dk, dv, None, None, None, None, None, None, None


_flash_attn_forward.register_autograd(_backward, setup_context=_setup_context)


def _check_inputs(q, k, v, varlen=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"flash_attn_cuda supports fp16 and bf16; {name} is {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    layout = "(total_tokens, nheads, head_dim)" if varlen else "(batch, seqlen, nheads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != (3 if varlen else 4):
            raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")
    nheads, head_dim = q.shape[-2:]
    if varlen:
        if k.shape[-1] != head_dim:
            raise ValueError(f"k must be (total_k, nheads_k, {head_dim}), got {tuple(k.shape)}")
    elif k.shape[0] != q.shape[0] or k.shape[3] != head_dim:
        raise ValueError(f"k must be ({q.shape[0]}, seqlen_k, nheads_k, {head_dim}), got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if not 0 < head_dim <= _MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {_MAX_HEAD_DIM}] (at most {_MAX_HEAD_DIM}), got {head_dim}")
    nheads_k = k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride(-1) == 1)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k, device):
    """Every check of the varlen offsets. The value checks read cu_seqlens back to the host: one
    device sync per forward call, skipped under torch.compile and CUDA graph capture, where it
    cannot run (the kernels then clamp every sequence to the tensors, so bad offsets give wrong
    rows but never out-of-bounds accesses)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {cu.dtype}")
        if cu.device != device:
            raise ValueError(f"{name} must be on the device of q ({device}), got {cu.device}")
        if cu.dim() != 1 or cu.numel() < 1:
            raise ValueError(f"{name} must be a 1-D tensor of length batch + 1, got shape {tuple(cu.shape)}")
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must both have length batch + 1, got {cu_seqlens_q.numel()} "
            f"and {cu_seqlens_k.numel()}"
        )
    for name, max_seqlen in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not 0 <= max_seqlen < 2**31:
            raise ValueError(f"{name} must be a non-negative int32, got {max_seqlen}")
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    offsets = torch.cat((cu_seqlens_q, cu_seqlens_k)).tolist()
    batch = cu_seqlens_q.numel() - 1
    for side, cu, total, max_seqlen in (
        ("q", offsets[: batch + 1], total_q, max_seqlen_q),
        ("k", offsets[batch + 1 :], total_k, max_seqlen_k),
    ):
        name = f"cu_seqlens_{side}"
        if cu[0] != 0:
            raise ValueError(f"{name} must start at 0, got {cu[0]}")
        lengths = [end - start for start, end in zip(cu, cu[1:])]
        if any(n < 0 for n in lengths):
            raise ValueError(f"{name} must be non-decreasing, got {cu}")
        if cu[-1] != total:
            raise ValueError(
                f"{name} must end at the number of tokens of {side} ({total}), got {cu[-1]}: every token "
                f"belongs to one sequence"
            )
        longest = max(lengths, default=0)
        if longest > max_seqlen:
            raise ValueError(f"max_seqlen_{side} ({max_seqlen}) is smaller than a sequence of length {longest}")


def _check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError("flash_attn_cuda: dropout_p != 0 is not implemented yet")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("flash_attn_cuda: window_size (local attention) is not implemented yet")
    if softcap != 0.0:
        raise NotImplementedError("flash_attn_cuda: softcap is not implemented yet")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_cuda: alibi_slopes is not implemented yet")


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
    _check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    _check_inputs(q, k, v)
    return _attention(q, k, v, None, None, 0, 0, softmax_scale, causal, deterministic, return_attn_probs)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               deterministic, return_attn_probs):
    """The custom op on checked inputs of either layout."""
    head_dim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    # The kernels exist for head dims 32, 64, ..., 256: pad with zeros (which change neither
    # q k^T nor the first head_dim columns of the output) and slice the output back.
    head_dim_padded = (head_dim + 31) // 32 * 32
    if head_dim_padded != head_dim:
        q, k, v = (F.pad(t, (0, head_dim_padded - head_dim)) for t in (q, k, v))
    out, softmax_lse = _flash_attn_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale),
        bool(causal), bool(deterministic),
    )
    if head_dim_padded != head_dim:
        out = out[..., :head_dim]
    return (out, softmax_lse, None) if return_attn_probs else out


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
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, head_dim): q, k, v are strided views of
    it (the kernels read them in place); the gradient arrives as one (batch, seqlen, 3, nheads,
    head_dim) tensor."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be (batch, seqlen, 3, nheads, head_dim), got shape {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


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
    nheads_k, head_dim), k and v being strided views of kv."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be (batch, seqlen_k, 2, nheads_k, head_dim), got shape {tuple(kv.shape)}")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


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
    _check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("flash_attn_cuda: block_table (paged KV cache) is not implemented yet")
    _check_inputs(q, k, v, varlen=True)
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0], q.device)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
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
    """flash_attn_varlen_func on qkv (total, 3, nheads, head_dim), q, k and v sharing cu_seqlens."""
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be (total, 3, nheads, head_dim), got shape {tuple(qkv.shape)}")
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


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
    """flash_attn_varlen_func on q (total_q, nheads, head_dim) and kv (total_k, 2, nheads_k, head_dim)."""
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv must be (total_k, 2, nheads_k, head_dim), got shape {tuple(kv.shape)}")
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
