"""The packed entry points against flash_attn_func on the same data, gradients included (GPU),
and their shape checks (CPU)."""

import pytest
import torch

from conftest import grads_of, peak_extra_bytes, random_qkv, requires_gpu, skip_unbuilt
from flash_attn_cuda import _extension, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_matches_unpacked(causal):
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 157, 157, 4, 4, head_dim, dtype, seed=31)
    dout = torch.randn_like(q)
    qkv = torch.stack([q, k, v], dim=2)
    out_packed, (dqkv,) = grads_of(lambda t: flash_attn_qkvpacked_func(t, causal=causal, deterministic=True),
                                   [qkv], dout)
    out, (dq, dk, dv) = grads_of(lambda a, b, c: flash_attn_func(a, b, c, causal=causal, deterministic=True),
                                 [q, k, v], dout)
    assert torch.equal(out_packed, out)
    assert torch.equal(dqkv, torch.stack([dq, dk, dv], dim=2))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_kvpacked_matches_unpacked_with_gqa(causal):
    dtype, head_dim = torch.float16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 120, 211, 8, 2, head_dim, dtype, seed=32)
    dout = torch.randn_like(q)
    kv = torch.stack([k, v], dim=2)
    out_packed, (dq_p, dkv) = grads_of(
        lambda a, t: flash_attn_kvpacked_func(a, t, causal=causal, deterministic=True), [q, kv], dout)
    out, (dq, dk, dv) = grads_of(lambda a, b, c: flash_attn_func(a, b, c, causal=causal, deterministic=True),
                                 [q, k, v], dout)
    assert torch.equal(out_packed, out)
    assert torch.equal(dq_p, dq) and torch.equal(dkv, torch.stack([dk, dv], dim=2))


@pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")
def test_packed_shapes_are_checked():
    with pytest.raises(ValueError, match="3 parts"):
        flash_attn_qkvpacked_func(torch.randn(1, 8, 2, 2, 64))
    with pytest.raises(ValueError, match="2 parts"):
        flash_attn_kvpacked_func(torch.randn(1, 8, 2, 64), torch.randn(1, 8, 3, 2, 64))


@pytest.mark.gpu
@requires_gpu
def test_qkvpacked_gradient_is_written_in_place():
    """The backward writes dqkv as one tensor: beyond it, only the fp32 dq accumulator and D are
    allocated (three separate gradients stacked by autograd would need dqkv twice)."""
    dtype, head_dim = torch.bfloat16, 128
    skip_unbuilt(head_dim, dtype)
    qkv = torch.randn(1, 8192, 3, 16, head_dim, device="cuda", dtype=dtype).requires_grad_()
    out = flash_attn_qkvpacked_func(qkv)
    dout = torch.randn_like(out)
    _, extra = peak_extra_bytes(lambda: out.backward(dout))
    dqkv = qkv.numel() * qkv.element_size()
    scratch = out.numel() * 4 + 16 * 8192 * 4
    assert extra <= dqkv + scratch + 8 * 2**20, f"backward allocated {extra} bytes beyond {dqkv + scratch}"
    assert qkv.grad.shape == qkv.shape and not qkv.grad.isnan().any()
