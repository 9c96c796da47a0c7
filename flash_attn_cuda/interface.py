"""The public functions, with the flash-attn 2.x signatures, and the torch.library custom op."""

import math

import torch
import torch.nn.functional as F

from flash_attn_cuda import _extension

_DTYPES = (torch.float16, torch.bfloat16)
_MAX_HEAD_DIM = 256


@torch.library.custom_op("flash_attn_cuda::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool, deterministic: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """deterministic is only recorded for the backward pass."""
    q, k, v = (_aligned(t) for t in (q, k, v))
    out, softmax_lse = _extension.load().fwd(q, k, v, None, softmax_scale, causal)
    return out, softmax_lse


@_flash_attn_forward.register_fake
def _(q, k, v, softmax_scale, causal, deterministic):
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flash_attn_cuda::_flash_attn_backward", mutates_args=())
def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dout, q, k, v, out = (_aligned(t) for t in (dout, q, k, v, out))
    dq, dk, dv = _extension.load().bwd(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic)
    return dq, dk, dv


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _aligned(t):
    """The kernels move 16 bytes at a time along a contiguous last dim: copy a tensor whose data,
    strides or last dim do not allow it."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, deterministic = inputs
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(softmax_lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, softmax_lse = ctx.saved_tensors
    dq, dk, dv = _flash_attn_backward(
        dout, q, k, v, out, softmax_lse, ctx.softmax_scale, ctx.causal, ctx.deterministic
    )
    return dq, dk, dv, None, None, None


_flash_attn_forward.register_autograd(_backward, setup_context=_setup_context)


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise TypeError(f"flash_attn_cuda supports fp16 and bf16; {name} is {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, seqlen, nheads, head_dim), got shape {tuple(t.shape)}")
    batch, _, nheads, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k must be ({batch}, seqlen_k, nheads_k, {head_dim}), got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if not 0 < head_dim <= _MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {_MAX_HEAD_DIM}] (at most {_MAX_HEAD_DIM}), got {head_dim}")
    if k.shape[2] == 0 or nheads % k.shape[2] != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({k.shape[2]})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride(-1) == 1)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


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
    out, softmax_lse = _flash_attn_forward(q, k, v, float(softmax_scale), bool(causal), bool(deterministic))
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
