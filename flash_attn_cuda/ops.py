"""The torch.library custom ops around the extension, with fake implementations (for
torch.compile), and the autograd.Functions that pair each forward op with its backward op. Each
serves the padded layout (cu_seqlens None) and the varlen one.

The autograd.Functions replace torch.library's register_autograd: its generated wrapper cost
about 25 us more host time per forward+backward call (benchmarks/NOTES.md, run 35), which small
shapes cannot hide."""

from typing import Optional

import torch

from flash_attn_cuda import _extension


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
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)


@_flash_attn_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic):
    return _forward_like(q, cu_seqlens_q)


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal):
    """(out, softmax_lse) from the extension."""
    q, k, v = (_aligned(t) for t in (q, k, v))
    out, softmax_lse = _extension.load().fwd(
        q, k, v, None, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
    )
    return out, softmax_lse


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
    return _backward_into(
        dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, deterministic,
    )


@_flash_attn_backward.register_fake
def _(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, deterministic):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _backward_into(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, deterministic, dq=None, dk=None, dv=None):
    """(dq, dk, dv) from the extension, written into dq, dk, dv where given."""
    dout, q, k, v, out = (_aligned(t) for t in (dout, q, k, v, out))
    return tuple(_extension.load().bwd(
        dout, q, k, v, out, softmax_lse, softmax_scale, causal, deterministic, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, dq=dq, dk=dk, dv=dv,
    ))


def _aligned(t):
    """The kernels move 16 bytes at a time along a contiguous last dim: copy a tensor whose data,
    strides or last dim do not allow it."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _keep_options(ctx, softmax_lse, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic):
    """What either backward needs besides its saved tensors."""
    # softmax_lse carries no gradient; without set_materialize_grads(False) autograd would also
    # allocate and zero-fill one for it on every backward (a kernel launch and host time, run 33).
    ctx.mark_non_differentiable(softmax_lse)
    ctx.set_materialize_grads(False)
    ctx.max_seqlen_q = max_seqlen_q
    ctx.max_seqlen_k = max_seqlen_k
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.deterministic = deterministic


class FlashAttnFunction(torch.autograd.Function):
    """(out, softmax_lse) of q, k, v and the forward op's other arguments."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                deterministic):
        out, softmax_lse = _flash_attn_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               softmax_scale, causal, deterministic)
        ctx.save_for_backward(q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k)
        _keep_options(ctx, softmax_lse, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic)
        return out, softmax_lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 10
        q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = _flash_attn_backward(
            dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_q, ctx.max_seqlen_k,
            ctx.softmax_scale, ctx.causal, ctx.deterministic,
        )
        return dq, dk, dv, None, None, None, None, None, None, None


def _unpack(q, packed):
    """q, k, v from a packed qkv (..., 3, nheads, head_dim) (q None) or from q and a packed kv
    (..., 2, nheads_k, head_dim)."""
    parts = packed.unbind(-3)
    return parts if q is None else (q, *parts)


# The packed ops take the packed tensor itself, so that its gradient is one tensor the backward
# kernel writes into, not three that autograd would stack (a copy).
@torch.library.custom_op("flash_attn_cuda::_flash_attn_packed_forward", mutates_args=())
def _flash_attn_packed_forward(
    q: Optional[torch.Tensor],
    packed: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(*_unpack(q, packed), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal)


@_flash_attn_packed_forward.register_fake
def _(q, packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic):
    return _forward_like(_unpack(q, packed)[0], cu_seqlens_q)


@torch.library.custom_op("flash_attn_cuda::_flash_attn_packed_backward", mutates_args=())
def _flash_attn_packed_backward(
    dout: torch.Tensor,
    q: Optional[torch.Tensor],
    packed: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dq, dpacked); dq is empty when q is None (its gradient is in dpacked)."""
    dpacked = torch.empty(packed.shape, dtype=packed.dtype, device=packed.device)
    dq = None if q is None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dq_, dk, dv = _unpack(dq, dpacked)
    _backward_into(
        dout, *_unpack(q, packed), out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, deterministic, dq=dq_, dk=dk, dv=dv,
    )
    return (dpacked.new_empty(0) if q is None else dq), dpacked


@_flash_attn_packed_backward.register_fake
def _(dout, q, packed, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      causal, deterministic):
    return (packed.new_empty(0) if q is None else q.new_empty(q.shape)), packed.new_empty(packed.shape)


class FlashAttnPackedFunction(torch.autograd.Function):
    """(out, softmax_lse) of q (or None) and a packed kv (or qkv), and the packed forward op's other
    arguments."""

    @staticmethod
    def forward(ctx, q, packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                deterministic):
        out, softmax_lse = _flash_attn_packed_forward(q, packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                      max_seqlen_k, softmax_scale, causal, deterministic)
        ctx.save_for_backward(q, packed, out, softmax_lse, cu_seqlens_q, cu_seqlens_k)
        _keep_options(ctx, softmax_lse, max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic)
        return out, softmax_lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 9
        q, packed, out, softmax_lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dpacked = _flash_attn_packed_backward(
            dout, q, packed, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, ctx.max_seqlen_q, ctx.max_seqlen_k,
            ctx.softmax_scale, ctx.causal, ctx.deterministic,
        )
        return (None if q is None else dq), dpacked, None, None, None, None, None, None, None
