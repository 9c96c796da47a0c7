"""unpad_input / pad_input / index_first_axis against plain loops and autograd (CPU)."""

import pytest
import torch

from flash_attn_cuda.bert_padding import index_first_axis, pad_input, unpad_input


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
