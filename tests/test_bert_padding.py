"""bert_padding's helpers (flash-attn's names) against plain loops and autograd (CPU)."""

import pytest
import torch

from flash_attn_cuda.bert_padding import (
    IndexFirstAxis,
    IndexPutFirstAxis,
    index_first_axis,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)


def random_mask(batch, seqlen, lengths):
    """Right-padded masks of the given lengths, as flash-attn users build them."""
    mask = torch.zeros(batch, seqlen, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    return mask


@pytest.mark.parametrize("lengths", [[5, 0, 7, 1], [7, 7, 7, 7], [0, 0, 0, 0]])
def test_unpad_input_matches_a_loop(lengths):
    gen = torch.Generator().manual_seed(len(lengths) + sum(lengths))
    hidden = torch.randn(4, 7, 3, 2, generator=gen)
    mask = random_mask(4, 7, lengths)
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    expected = torch.cat([hidden[b, :n] for b, n in enumerate(lengths)])
    assert torch.equal(unpadded, expected)
    assert indices.dtype == torch.int64
    assert torch.equal(indices, torch.tensor([b * 7 + i for b, n in enumerate(lengths) for i in range(n)],
                                             dtype=torch.int64))
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [sum(lengths[:b]) for b in range(5)]
    assert max_seqlen == max(lengths) and isinstance(max_seqlen, int)
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths


def test_mask_holes_and_int_masks():
    """Masks need not be right-padded; int masks count as their nonzero entries."""
    hidden = torch.arange(2 * 5, dtype=torch.float32).view(2, 5, 1)
    mask = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 0, 1]], dtype=torch.int32)
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    assert unpadded.flatten().tolist() == [0.0, 2.0, 3.0, 9.0]
    assert indices.tolist() == [0, 2, 3, 9]
    assert cu_seqlens.tolist() == [0, 3, 4] and max_seqlen == 3 and seqused.tolist() == [3, 1]


def test_unused_mask_is_kept_and_counted_in_cu_seqlens_only():
    hidden = torch.randn(2, 6, 4)
    mask = random_mask(2, 6, [3, 2])
    unused = torch.zeros(2, 6, dtype=torch.bool)
    unused[0, 3:5] = True
    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert cu_seqlens.tolist() == [0, 5, 7] and max_seqlen == 5
    assert seqused.tolist() == [3, 2]
    assert torch.equal(unpadded, hidden.reshape(12, 4)[indices])


def test_pad_input_inverts_unpad_input():
    hidden = torch.randn(3, 9, 2, 4)
    mask = random_mask(3, 9, [9, 4, 0])
    unpadded, indices, _, _, _ = unpad_input(hidden, mask)
    padded = pad_input(unpadded, indices, 3, 9)
    assert padded.shape == hidden.shape
    assert torch.equal(padded, hidden * mask[..., None, None])


def test_gradients_match_plain_indexing():
    indices = torch.tensor([4, 0, 7, 2])
    x = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (x,))
    values = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, 3, 3), (values,))
    grad = torch.randn(4, 3, dtype=torch.float64)
    (ours,) = torch.autograd.grad(index_first_axis(x, indices), x, grad)
    (plain,) = torch.autograd.grad(x[indices], x, grad)
    assert torch.equal(ours, plain)


def test_mask_shape_must_match():
    with pytest.raises(ValueError, match="attention_mask"):
        unpad_input(torch.randn(2, 5, 3), torch.ones(2, 4, dtype=torch.bool))


def test_int32_indices_as_transformers_passes_them():
    """pad_input and index_first_axis take int32 indices (flash-attn does; transformers' left-padded
    generate passes them), with the same values and gradients as int64."""
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(3, 5, 4, generator=gen)
    mask = random_mask(3, 5, [2, 5, 0])
    unpadded, indices, *_ = unpad_input(hidden, mask)
    for idx in (indices, indices.int()):
        x = hidden.reshape(15, 4).clone().requires_grad_()
        gathered = index_first_axis(x, idx)
        assert torch.equal(gathered, unpadded)
        gathered.sum().backward()
        assert torch.equal(x.grad, mask.reshape(15, 1).float().expand(15, 4))
        values = unpadded.clone().requires_grad_()
        padded = pad_input(values, idx, 3, 5)
        assert torch.equal(padded, hidden * mask[..., None])
        padded.sum().backward()
        assert torch.equal(values.grad, torch.ones_like(unpadded))


def test_concatenated_sequences_follow_flash_attns_example():
    """flash-attn's documented example: rows holding sequences of 2 and 3, 3 and 2, and 6 tokens."""
    hidden = torch.arange(3 * 6, dtype=torch.float32).view(3, 6, 1)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]], dtype=torch.int32)
    result = unpad_input_for_concatenated_sequences(hidden, lengths)
    assert len(result) == 4
    unpadded, indices, cu_seqlens, max_seqlen = result
    kept = [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]
    assert indices.dtype == torch.int64 and indices.tolist() == kept
    assert unpadded.flatten().tolist() == [float(i) for i in kept]
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16]
    assert max_seqlen == 6 and isinstance(max_seqlen, int)


def test_concatenated_sequences_round_trip_through_pad_input():
    """pad_input puts the packed tokens back at their positions, zeros past each row's sequences;
    the gradient reaches exactly the packed positions."""
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 5, 3, generator=gen, requires_grad=True)
    lengths = torch.tensor([[1, 1, 2, 0, 0], [0, 0, 0, 0, 0]])
    unpadded, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(hidden, lengths)
    assert cu_seqlens.tolist() == [0, 1, 2, 4] and max_seqlen == 2
    padded = pad_input(unpadded, indices, 2, 5)
    expected = torch.zeros(2, 5, 3)
    expected[0, :4] = hidden.detach()[0, :4]
    assert torch.equal(padded, expected)
    padded.sum().backward()
    grad = torch.zeros(2, 5, 3)
    grad[0, :4] = 1.0
    assert torch.equal(hidden.grad, grad)


def test_concatenated_sequences_reject_a_mask_of_another_shape():
    with pytest.raises(ValueError, match="attention_mask_in_length"):
        unpad_input_for_concatenated_sequences(torch.zeros(2, 5, 3), torch.zeros(2, 4, dtype=torch.int32))


def test_index_put_first_axis_scatters_and_gathers_back():
    """flash-attn's index_put_first_axis: values at the given rows of a zero tensor; the gradient
    of the values is the output's gradient at those rows."""
    values = torch.arange(6, dtype=torch.float32).view(3, 2).requires_grad_()
    indices = torch.tensor([4, 0, 2], dtype=torch.int32)
    out = index_put_first_axis(values, indices, 5)
    assert out.tolist() == [[2.0, 3.0], [0.0, 0.0], [4.0, 5.0], [0.0, 0.0], [0.0, 1.0]]
    (out * torch.arange(10, dtype=torch.float32).view(5, 2)).sum().backward()
    assert values.grad.tolist() == [[8.0, 9.0], [0.0, 1.0], [4.0, 5.0]]
    assert IndexPutFirstAxis.apply(values, indices, 5).tolist() == out.tolist()
    assert torch.equal(IndexFirstAxis.apply(out, indices), values.detach())
