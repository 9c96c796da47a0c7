import math

import pytest
import torch

from flash_attn_cuda import _extension
from flash_attn_cuda.head_dims import kernel_head_dim
from flash_attn_cuda.reference import attention_ref


def gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if not _extension.is_built():
        return "the flash_attn_cuda extension is not built"
    return None


def kernel_skip_reason(head_dim, dtype):
    """Why the kernel for this head dim / dtype cannot run here, or None."""
    reason = gpu_skip_reason()
    if reason:
        return reason
    built = _extension.load().built_config()
    kernel_dim = kernel_head_dim(head_dim)
    if kernel_dim not in built["head_dims"]:
        return f"head dim {kernel_dim} not built (FLASH_ATTN_HDIMS)"
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    if name not in built["dtypes"]:
        return f"{name} not built (FLASH_ATTN_DTYPES)"
    return None


def dtype_id(dtype):
    """Test ids fp16 / bf16, so that `pytest -k fp16` selects one dtype."""
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


requires_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))


@pytest.fixture(params=["sm80", "sm90"])
def kernel_family(request, monkeypatch):
    """Runs a test once per kernel family, forced through FLASH_ATTN_CUDA_FAMILY (forward and
    backward): sm80; sm90 where it is built and the GPU is sm90 (every problem it supports, also
    the short backward problems that the default leaves to the FA2 family), else skipped."""
    monkeypatch.setenv("FLASH_ATTN_CUDA_FAMILY", request.param)
    if request.param == "sm90" and gpu_skip_reason() is None:
        if "sm90" not in _extension.load().built_config()["families"]:
            pytest.skip("the sm90 family is not built (FLASH_ATTN_CUDA_ARCHS without 90)")
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("the sm90 family needs an sm90 GPU")
    return request.param


def skip_unbuilt(head_dim, dtype):
    reason = kernel_skip_reason(head_dim, dtype)
    if reason:
        pytest.skip(reason)


def heads_for_more_tiles_than_sms(batch, key_blocks):
    """Heads enough for more than two (KV block of 128 keys, head, batch) tiles per SM of this GPU,
    so that the Hopper backward's blocks walk several tiles each."""
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count // (batch * key_blocks) + 1


def poison_allocator():
    """Fills freed blocks of the caching allocator with NaN bytes (0xff), so that an output
    element the kernel fails to write reads as NaN instead of a lucky old value."""
    for nbytes in (2**20 - 4096, 256 * 2**20):
        torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)


def random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def lift_key_groups(q, k, jump, seed):
    """Each 64-key group of k lifts its scores by its own random offset of 0-jump, times a per-row
    factor in [0, 1] (q's first column): the running max of a row jumps from one KV block to the
    next. In place; the offsets from their own seeded generator."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seqlen_k, head_dim = k.shape[1], k.shape[-1]
    offsets = jump * torch.rand((seqlen_k + 63) // 64, device="cuda", generator=gen)
    k[..., 0] = offsets.repeat_interleave(64)[:seqlen_k, None] * head_dim**0.5
    q[..., 0] = torch.rand(q.shape[:-1], device="cuda", generator=gen)


def random_dout(q, seed):
    """A gradient of the output shaped like q, from its own seeded generator."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=gen)


def grads_of(fn, inputs, dout):
    """(fn(*leaves), the gradients of the leaves) for fresh leaf copies of inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return out, torch.autograd.grad(out, leaves, dout)


def peak_extra_bytes(fn):
    """(fn(), the most memory allocated while it ran beyond what was allocated before)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def assert_compiled_grads_equal_eager(loss_fn, inputs):
    """torch.compile(fullgraph=True) of loss_fn gives bitwise the gradients of eager loss_fn."""
    compiled = torch.compile(loss_fn, fullgraph=True)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    compiled(*leaves).backward()
    eager = [t.detach().clone().requires_grad_() for t in inputs]
    loss_fn(*eager).backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def assert_within_rule(name, value, value_ref, value_pt):
    """The numerics rule of DESIGN.md: max|x - x_ref| <= 2 max|x_pt - x_ref| + 1e-5, x_ref in float32
    and x_pt from the standard implementation in the inputs' dtype; NaN fails."""
    err = (value.float() - value_ref.float()).abs().max().item() if value.numel() else 0.0
    err_pt = (value_pt.float() - value_ref.float()).abs().max().item() if value.numel() else 0.0
    assert not math.isnan(err), f"NaN in {name}"
    assert err <= 2 * err_pt + 1e-5, f"{name}: max error {err} vs standard implementation's {err_pt}"


def assert_lse_within(lse, lse_ref):
    """Rows whose reference lse is infinite (no visible key) have +inf, the others are within 1e-3
    absolute of it: an fp32 sum of exps of fp32 scores errs far below that."""
    finite = lse_ref.isfinite()
    assert torch.equal(lse.isfinite(), finite), "rows with no visible key must have lse +inf"
    torch.testing.assert_close(lse[finite], lse_ref[finite], rtol=0, atol=1e-3)


def xfail_single_query_bf16_backward(request):
    """Known, not fixed: with one query row at d=128 in bf16, the backward's dq or dk error reaches
    2.1-2.7x the standard implementation's in two seeded cases (ALiBi per batch with seqlen_k 129,
    and seqlen_k 2), over the rule's 2x. Marked strict, so a fix shows up as a failure to update."""
    request.applymarker(pytest.mark.xfail(strict=True, reason="known bf16 backward error at seqlen_q = 1, d=128 "
                                                             "(benchmarks/NOTES.md, runs 54-57)"))


def cu_seqlens_of(lengths, device="cuda"):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def attention_ref_per_sequence(q, k, v, lengths_q, lengths_k, variant_of=lambda b: {}, **variant):
    """attention_ref on each sequence of varlen q, k, v (rows split by lengths_q / lengths_k), with
    the arguments variant and variant_of(b) for sequence b: (out (total_q, nheads, d), lse (nheads,
    total_q)), the sequences' results concatenated as flash_attn_varlen_func lays them out."""
    outs, lses = [], []
    for b, (q_b, k_b, v_b) in enumerate(zip(q.split(lengths_q), k.split(lengths_k), v.split(lengths_k))):
        out_b, lse_b = attention_ref(q_b[None], k_b[None], v_b[None], **variant, **variant_of(b))
        outs.append(out_b[0])
        lses.append(lse_b[0])
    return torch.cat(outs), torch.cat(lses, dim=1)
