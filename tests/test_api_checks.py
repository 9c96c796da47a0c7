"""Argument checking of flash_attn_func: each bad input gets a clear Python exception (CPU). The op
checks the tensors (csrc/api/checks.cpp) on any device, so these run without a GPU, but they need
the extension built."""

import pytest
import torch

from flash_attn_cuda import _extension, flash_attn_func

needs_extension = pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")


def tensors(shape_q=(1, 8, 2, 64), shape_k=None, dtype=torch.bfloat16, device="cpu"):
    shape_k = shape_k or shape_q
    q = torch.randn(shape_q).to(dtype=dtype, device=device)
    k = torch.randn(shape_k).to(dtype=dtype, device=device)
    v = torch.randn(shape_k).to(dtype=dtype, device=device)
    return q, k, v


@needs_extension
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype(dtype):
    q, k, v = tensors(dtype=dtype)
    with pytest.raises(TypeError, match="fp16 and bf16"):
        flash_attn_func(q, k, v)


@needs_extension
def test_mixed_dtypes():
    q, k, v = tensors()
    with pytest.raises(TypeError, match="dtype of q"):
        flash_attn_func(q, k.half(), v)


@needs_extension
def test_wrong_ndim():
    q, k, v = tensors()
    with pytest.raises(ValueError, match="batch, seqlen_q, nheads, head_dim"):
        flash_attn_func(q[0], k, v)


def test_head_dim_above_256():
    q, k, v = tensors(shape_q=(1, 8, 2, 264))
    with pytest.raises(ValueError, match="at most 256"):
        flash_attn_func(q, k, v)


@needs_extension
def test_nheads_not_multiple_of_nheads_k():
    q, k, v = tensors(shape_q=(1, 8, 3, 64), shape_k=(1, 8, 2, 64))
    with pytest.raises(ValueError, match="multiple of nheads_k"):
        flash_attn_func(q, k, v)


@needs_extension
def test_mismatched_k_v():
    q, k, v = tensors()
    with pytest.raises(ValueError, match="shape of k"):
        flash_attn_func(q, k, v[:, :4])


@needs_extension
def test_cpu_tensor():
    q, k, v = tensors()
    with pytest.raises(ValueError, match="CUDA tensor"):
        flash_attn_func(q, k, v)
