"""The argument checks Python makes before calling an op. The tensors themselves (dtypes, shapes,
devices, cu_seqlens' kind) are checked by the op (csrc/api/checks.cpp), on any device; here only what
must happen before it: the head dim before it is padded, the values of cu_seqlens (read back to
the host). The options are checked by the op."""

import torch

from flash_attn_cuda.head_dims import MAX_HEAD_DIM


def check_head_dim(head_dim):
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}] (at most {MAX_HEAD_DIM}), got {head_dim}")


def check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, total_q, total_k):
    """The checks of the varlen offsets' values, which read them back to the host (a device sync),
    once per cu_seqlens tensor: a tensor that passed is marked, and not read again until it is
    modified in place (its version counter moves) or used with a new total or max_seqlen. So a
    model's layers and the backward pass share one sync per batch. Skipped under torch.compile and
    CUDA graph capture, where they cannot run: the kernels then clamp every sequence to the tensors,
    so bad offsets give wrong rows but never out-of-bounds accesses. Offsets the op will reject for
    their kind (dtype, shape, device) are left to it."""
    if torch.compiler.is_compiling():
        return
    for cu, side, total, max_seqlen in ((cu_seqlens_q, "q", total_q, max_seqlen_q),
                                        (cu_seqlens_k, "k", total_k, max_seqlen_k)):
        if not (isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1 and cu.numel() >= 1):
            return
        if cu.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return
        check_offsets(cu, side, total, max_seqlen)


def check_offsets(cu_seqlens, side, total, max_seqlen):
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
