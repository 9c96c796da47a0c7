"""Padding helpers for the variable-length entry points, with flash-attn 2.x's names and semantics
(flash_attn.bert_padding, 2.7 on): unpad_input turns a padded (batch, seqlen, ...) tensor and its
mask into packed tokens plus the cu_seqlens the varlen functions take; pad_input scatters packed
tokens back; unpad_input_for_concatenated_sequences packs rows that hold several sequences each.

Gathers and scatters along the first axis are autograd Functions whose backward is the matching
scatter or gather of the same unique indices (no accumulation, so no atomics). Indices may be int32
or int64, as flash-attn accepts (transformers passes int32)."""

import torch
import torch.nn.functional as F


class IndexFirstAxis(torch.autograd.Function):
    """input[indices] along the first axis."""

    @staticmethod
    def forward(ctx, input, indices):
        indices = indices.long()
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros((ctx.first_axis_dim, *grad_output.shape[1:]))
        grad_input.index_copy_(0, indices, grad_output)
        return grad_input, None


class IndexPutFirstAxis(torch.autograd.Function):
    """A zero tensor of first_axis_dim rows with values at the rows indices."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        indices = indices.long()
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim, *values.shape[1:]))
        output.index_copy_(0, indices, values)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


def index_first_axis(input, indices):
    """input[indices] for a 1-D int32 or int64 tensor of unique indices into input's first axis."""
    return IndexFirstAxis.apply(input, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """A zero tensor of first_axis_dim rows (values' other dims) with values[i] at row indices[i]
    (unique indices)."""
    return IndexPutFirstAxis.apply(values, indices, first_axis_dim)


def _check_mask_shape(name, mask, hidden_states):
    if mask.shape != hidden_states.shape[:2]:
        raise ValueError(f"{name} must have shape (batch, seqlen) = {tuple(hidden_states.shape[:2])}, "
                         f"got {tuple(mask.shape)}")


def _packed(hidden_states, indices, seqlens):
    """(hidden_states' tokens at the flattened (batch * seqlen) positions indices, cu_seqlens (int32)
    of the sequences of lengths seqlens, the longest of them as an int)."""
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    return index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices), cu_seqlens, max_seqlen


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...); attention_mask (batch, seqlen), bool or int, nonzero
    where a token is valid; unused_mask (batch, seqlen), nonzero where a token is allocated but
    unused (it is kept in the output, and counted by cu_seqlens but not by seqused).

    Returns (hidden_states (total_nnz, ...), indices (total_nnz,) int64 into the flattened
    (batch * seqlen) positions, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch (int),
    seqused (batch,) int32: the valid tokens of each sequence)."""
    _check_mask_shape("attention_mask", attention_mask, hidden_states)
    used = attention_mask.bool()
    all_masks = used if unused_mask is None else used | unused_mask.bool()
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    seqused = used.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten()).flatten()
    unpadded, cu_seqlens, max_seqlen_in_batch = _packed(hidden_states, indices, seqlens)
    return unpadded, indices, cu_seqlens, max_seqlen_in_batch, seqused


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Rows that each hold several sequences one after another (packed samples), as flash-attn's
    function of the name: attention_mask_in_length (batch, seqlen) int holds, at the start of row
    b, the lengths of the sequences in row b, then zeros; e.g. [[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0,
    0]] for two sequences of 2 and 3 tokens in row 0 (tokens 0-4) and one of 6 in row 1.

    Returns (hidden_states (total, ...): the rows' first sum(lengths) tokens, indices (total,)
    int64 into the flattened (batch * seqlen) positions, cu_seqlens (sequences + 1,) int32 over every
    sequence of every row, max_seqlen (int)): four values, as flash-attn's."""
    _check_mask_shape("attention_mask_in_length", attention_mask_in_length, hidden_states)
    lengths = attention_mask_in_length.flatten()
    seqlens = lengths[lengths != 0].to(torch.int32)
    tokens_per_row = attention_mask_in_length.sum(dim=-1)
    positions = torch.arange(hidden_states.shape[1], device=attention_mask_in_length.device)
    indices = torch.nonzero((positions.unsqueeze(0) < tokens_per_row.unsqueeze(1)).flatten()).flatten()
    unpadded, cu_seqlens, max_seqlen = _packed(hidden_states, indices, seqlens)
    return unpadded, indices, cu_seqlens, max_seqlen


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total_nnz, ...) at the flattened positions indices -> (batch, seqlen, ...),
    zero elsewhere."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.view(batch, seqlen, *hidden_states.shape[1:])
