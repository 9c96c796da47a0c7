"""Argument checks of the public functions: a clear Python exception for every input the kernels
do not take."""

import torch

DTYPES = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256


def check_inputs(q, k, v, varlen=False):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in DTYPES:
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
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}] (at most {MAX_HEAD_DIM}), got {head_dim}")
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


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k, device):
    """Every check of the varlen offsets. The checks of their values read them back to the host (a
    device sync), once per cu_seqlens tensor: a tensor that passed is marked, and not read again
    until it is modified in place (its version counter moves) or used with a new total or
    max_seqlen. So a model's layers and the backward pass share one sync per batch. The value checks
    are skipped under torch.compile and CUDA graph capture, where they cannot run: the kernels then
    clamp every sequence to the tensors, so bad offsets give wrong rows but never out-of-bounds
    accesses."""
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
        if not 0 <= max_seqlen < 2**30:
            raise ValueError(f"{name} must be in [0, 2**30), got {max_seqlen}")
    if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return
    _check_offsets(cu_seqlens_q, "q", total_q, max_seqlen_q)
    _check_offsets(cu_seqlens_k, "k", total_k, max_seqlen_k)


def _check_offsets(cu_seqlens, side, total, max_seqlen):
    # The tensor keeps (version, data_ptr) and the (total, max_seqlen) pairs it passed with. Writes
    # that bypass the version counter (through .data, DLPack or raw pointers) are not seen; the
    # kernels' clamps still keep those in bounds. Inference-mode tensors have no version counter:
    # they are checked every time.
    state = None if cu_seqlens.is_inference() else (cu_seqlens._version, cu_seqlens.data_ptr())
    stamps = getattr(cu_seqlens, "_flash_attn_cuda_checked", None)
    if state is not None and stamps is not None and stamps[0] == state and (total, max_seqlen) in stamps[1]:
        return
    cu = cu_seqlens.tolist()
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
    if state is not None:
        passed = stamps[1] if stamps is not None and stamps[0] == state else set()
        cu_seqlens._flash_attn_cuda_checked = (state, passed | {(total, max_seqlen)})


def check_unbuilt_options(dropout_p, window_size, softcap, alibi_slopes):
    if dropout_p != 0.0:
        raise NotImplementedError("flash_attn_cuda: dropout_p != 0 is not implemented yet")
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("flash_attn_cuda: window_size (local attention) is not implemented yet")
    if softcap != 0.0:
        raise NotImplementedError("flash_attn_cuda: softcap is not implemented yet")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_cuda: alibi_slopes is not implemented yet")
