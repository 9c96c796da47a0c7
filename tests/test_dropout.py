"""Dropout (flash-attn 2.x semantics), forward and backward (GPU), on both forward families (the
Hopper one serves dropout without return_attn_probs): the mask the kernels draw against the
plain-torch Philox (flash_attn_cuda.dropout), the outputs and gradients against the float32
reference with that mask, the mask's statistics, reproducibility from torch's generator, CUDA graph
replay, torch.compile."""

import math

import pytest
import torch

from conftest import (assert_lse_within, assert_within_rule, dtype_id, heads_for_more_tiles_than_sms, lift_key_groups,
                      poison_allocator, random_dout, random_qkv, requires_gpu, skip_unbuilt)
from flash_attn_cuda import _extension, flash_attn_func, flash_attn_varlen_func
from flash_attn_cuda.dropout import dropout_mask, kept_from_probs
from flash_attn_cuda.interface import _get_block_size_n
from flash_attn_cuda.reference import attention_ref, visible

pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.usefixtures("kernel_family")]


def cuda_generator(device):
    """The generator dropout draws from: the next forward takes its seed and current offset."""
    return torch.cuda.default_generators[torch.device(device).index or 0]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(113, 203), (203, 113), (256, 256)])
def test_kernel_mask_is_the_philox_mask(head_dim, causal, seqlen_q, seqlen_k):
    """The signs of return_attn_probs equal the plain-torch Philox mask of the (seed, offset) the
    forward returns, on every entry the kernel visits."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 3, 3, head_dim, dtype, seed=head_dim + seqlen_q)
    options = (0, 0, 1 / math.sqrt(head_dim), causal, -1, -1, 0.0, None, False, 0.3, True)
    _, _, rng_state, s_dmask = _extension.ops().fwd(q, k, v, None, None, *options)
    seed, offset = rng_state.tolist()
    expected = dropout_mask(seed, offset, 2, 3, seqlen_q, seqlen_k, 0.3, device="cuda")
    seen = visible(seqlen_q, seqlen_k, causal, device="cuda")
    got = kept_from_probs(s_dmask, seqlen_q, seqlen_k)
    assert torch.equal(got[..., seen], expected[..., seen])


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dropout_p", [0.3, 0.01, 0.5, 1 - 0x7C00 / 65536])
def test_masks_read_through_identity_operands(head_dim, dropout_p):
    """Every kernel's mask exactly, the Hopper ones' included (they write no probabilities): with V
    the identity, O = z (Z o P) is zero exactly where the forward dropped, and with dO the identity,
    dV = z (Z o P)^T exactly where the backward did. csrc/common/dropout_threshold.h's cases: p = 0.01
    keeps more numbers than a float16 threshold can, so the compare's answer is inverted; p = 0.5
    compares with a subnormal threshold and 1 - 0x7C00 / 2^16 with -0 (a compare that flushed
    subnormals to zero, or told -0 from +0, would differ there)."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    batch, n, nheads = 2, head_dim, 3  # as many queries and keys as head_dim: the identities are square
    q, k, _ = random_qkv(batch, n, n, nheads, nheads, head_dim, dtype, seed=21)
    eye = torch.eye(n, device="cuda", dtype=dtype).view(1, n, 1, n).expand(batch, n, nheads, n).contiguous()
    v = eye.clone().requires_grad_()
    gen = cuda_generator(q.device)
    seed, offset = gen.initial_seed(), gen.get_offset()
    out = flash_attn_func(q, k, v, dropout_p=dropout_p)
    out.backward(eye)
    expected = dropout_mask(seed, offset, batch, nheads, n, n, dropout_p, device="cuda")
    assert 0 < expected.float().mean().item() < 1
    # out[b, i, h, j] = z Z_ij P_ij, v.grad[b, j, h, i] = z Z_ij P_ij, against expected[b, h, i, j]
    assert torch.equal(out.permute(0, 2, 1, 3) != 0, expected)
    assert torch.equal(v.grad.permute(0, 2, 3, 1) != 0, expected)


def check_against_reference(q, k, v, dout, dropout_p, mask_seed, causal=False, window_size=(-1, -1), softcap=0.0,
                            alibi_slopes=None):
    """Forward and backward with dropout (no return_attn_probs, which the Hopper family leaves to the
    FA2 one) against the float32 reference given the Philox mask of the generator's (seed, offset),
    each within the numerics rule; dout None: the forward alone. The op gives lse and the rng_state;
    flash_attn_func, with the generator set back to the same offset, the gradients. The generator is
    seeded with mask_seed first: otherwise the mask, and with it the error's margin to the rule,
    depended on which tests ran before (benchmarks/NOTES.md, run 238)."""
    poison_allocator()
    variant = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    gen = cuda_generator(q.device)
    gen.manual_seed(mask_seed)
    seed, offset = gen.initial_seed(), gen.get_offset()
    options = (0, 0, 1 / math.sqrt(q.shape[-1]), causal, *window_size, softcap, alibi_slopes, False, dropout_p, False)
    out, lse, rng_state, _ = _extension.ops().fwd(q, k, v, None, None, *options)
    assert rng_state.tolist() == [seed, offset]
    kept = dropout_mask(seed, offset, q.shape[0], q.shape[2], q.shape[1], k.shape[1], dropout_p, device="cuda")

    def reference(upcast):
        inputs = [(t.detach().float() if upcast else t.detach().clone()).requires_grad_() for t in (q, k, v)]
        o, l = attention_ref(*inputs, upcast=upcast, dropout_p=dropout_p, dropout_mask=kept, **variant)
        return o, l, (torch.autograd.grad(o, inputs, dout.to(o.dtype)) if dout is not None else ())

    ref_out, ref_lse, ref_grads = reference(upcast=True)
    pt_out, _, pt_grads = reference(upcast=False)
    assert_within_rule("out", out, ref_out, pt_out)
    assert_lse_within(lse, ref_lse)
    if dout is None:
        return
    gen.set_offset(offset)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_again = flash_attn_func(*leaves, dropout_p=dropout_p, **variant)
    assert torch.equal(out_again, out)
    grads = torch.autograd.grad(out_again, leaves, dout)
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_within_rule(name, g, g_ref, g_pt)


# (dtype, head_dim, causal, seqlen_q, seqlen_k, dropout_p) whose seeded draw misses the rule.
KNOWN_OVER_RULE = {
    (torch.bfloat16, 64, True, 203, 113, 0.5):
        "dq 2.03x at row 92, which sees three keys, all kept (a few-key row, as in test_fuzz). Over 90 masks of this "
        "case 1 draw exceeds 2x (max 1.89x with Philox-10's masks; benchmarks/NOTES.md, run 304)",
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 129), (113, 203), (203, 113), (512, 512)])
@pytest.mark.parametrize("dropout_p", [0.17, 0.5])
def test_dropout_matches_reference(request, dtype, head_dim, causal, seqlen_q, seqlen_k, dropout_p):
    skip_unbuilt(head_dim, dtype)
    known = KNOWN_OVER_RULE.get((dtype, head_dim, causal, seqlen_q, seqlen_k, dropout_p))
    if known is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known miss of the numerics rule: {known}"))
    seed = seqlen_q + 3 * seqlen_k + head_dim
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, seed=seed)
    check_against_reference(q, k, v, random_dout(q, seed + 1), dropout_p, seed, causal=causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_running_max_jumps(head_dim, causal):
    """Dropout with large jumps of the running max (K's 64-key groups lifted by up to 150,
    conftest.lift_key_groups): rows rescale O where their max outgrows the lag the forward allows
    (common/softmax.h), with the masks of their blocks. (A dropout kernel at the rows' current max,
    which redoes a block whose max outgrows it, passed this and was not kept: benchmarks/NOTES.md,
    run 305.) Forward: out and lse against the reference with the Philox mask."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 300, 1100, 4, 4, head_dim, dtype, seed=head_dim + causal + 40)
    lift_key_groups(q, k, 150, seed=head_dim)
    check_against_reference(q, k, v, None, 0.3, head_dim + causal, causal=causal)


@pytest.mark.parametrize("variant", [{"window_size": (64, 32)}, {"softcap": 20.0, "causal": True},
                                     {"window_size": (100, 0), "softcap": 5.0}])
def test_dropout_with_other_variants(variant):
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 300, 257, 4, 4, head_dim, dtype, seed=5)
    check_against_reference(q, k, v, random_dout(q, 6), 0.2, 5, **variant)


def test_dropout_with_alibi():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 200, 200, 4, 4, head_dim, dtype, seed=8)
    slopes = torch.rand(2, 4, device="cuda") * 0.2
    check_against_reference(q, k, v, random_dout(q, 9), 0.25, 8, causal=True, alibi_slopes=slopes)


def test_dropout_with_more_tiles_than_sms():
    """The Hopper backward's dropout masks from tile to tile of one block (test_variants.py,
    test_more_tiles_than_sms_match_reference)."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    nheads = heads_for_more_tiles_than_sms(2, 3)
    q, k, v = random_qkv(2, 200, 300, nheads, nheads, head_dim, dtype, seed=11)
    check_against_reference(q, k, v, random_dout(q, 12), 0.15, 11, window_size=(100, 50))


def test_kept_fraction_within_four_sigma():
    dtype, head_dim, p = torch.bfloat16, 64, 0.3
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 1024, 1024, 4, 4, head_dim, dtype, seed=3)
    _, _, s_dmask = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    kept = kept_from_probs(s_dmask, 1024, 1024)
    sigma = (p * (1 - p) / kept.numel()) ** 0.5
    assert abs(kept.float().mean().item() - (1 - p)) < 4 * sigma


def test_probabilities_decode_as_flash_attn_does():
    """|S_dmask| block by block (blocks of _get_block_size_n keys, the running max over this and the
    later blocks) normalizes to the attention probabilities, as flash-attn's tests decode them."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    for causal in (False, True):
        q, k, v = random_qkv(1, 150, 300, 2, 2, head_dim, dtype, seed=11)
        _, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=0.1, causal=causal, return_attn_probs=True)
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(head_dim)
        seen = visible(150, 300, causal, device="cuda")
        scores = scores.masked_fill(~seen, float("-inf"))
        block_n = _get_block_size_n(q.device, head_dim, True, causal)
        block_max = torch.stack([s.amax(-1) for s in scores.split(block_n, dim=-1)], dim=-1)
        running_max = block_max.flip(-1).cummax(-1).values.flip(-1)
        unnorm = s_dmask[:, :, :150, :300].abs().float()
        probs = torch.cat([a * torch.exp(m.unsqueeze(-1) - lse.unsqueeze(-1))
                           for a, m in zip(unnorm.split(block_n, dim=-1), running_max.unbind(-1))], dim=-1)
        expected = torch.softmax(scores, dim=-1)
        torch.testing.assert_close(probs, expected, atol=2e-3, rtol=1e-2)


def test_same_seed_same_output_and_fresh_masks_otherwise():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 256, 256, 4, 4, head_dim, dtype, seed=1)
    torch.manual_seed(123)
    first = flash_attn_func(q, k, v, dropout_p=0.4)
    second = flash_attn_func(q, k, v, dropout_p=0.4)
    torch.manual_seed(123)
    again = flash_attn_func(q, k, v, dropout_p=0.4)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_backward_regenerates_the_forward_mask_after_other_draws():
    """The backward uses the forward's saved (seed, offset), not the generator's state at backward
    time: drawing in between changes nothing."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 200, 200, 2, 2, head_dim, dtype, seed=2)
    dout = random_dout(q, 3)
    grads = []
    for draws_between in (False, True):
        torch.manual_seed(7)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attn_func(*leaves, dropout_p=0.3, deterministic=True)
        if draws_between:
            torch.rand(1000, device="cuda")
            flash_attn_func(q, k, v, dropout_p=0.3)
        grads.append(torch.autograd.grad(out, leaves, dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_cuda_graph_replays_draw_fresh_masks():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 256, 256, 2, 2, head_dim, dtype, seed=4)
    flash_attn_func(q, k, v, dropout_p=0.5)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v, dropout_p=0.5)
    replays = []
    for _ in range(2):
        graph.replay()
        replays.append(out.clone())
    torch.cuda.synchronize()
    assert not torch.equal(replays[0], replays[1])
    # Each replay is still a dropout of the same attention: equal where both kept everything.
    assert torch.isfinite(replays[0]).all() and torch.isfinite(replays[1]).all()


def test_compiled_dropout_traces_and_draws():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 128, 128, 2, 2, head_dim, dtype, seed=5))

    @torch.compile(fullgraph=True)
    def loss(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=0.3, causal=True).float().sum()

    first, second = loss(q, k, v), loss(q, k, v)
    assert first.item() != second.item()
    first.backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_varlen_dropout_matches_reference_per_sequence():
    dtype, head_dim, p = torch.bfloat16, 64, 0.2
    skip_unbuilt(head_dim, dtype)
    lengths = [70, 0, 129, 33]
    total = sum(lengths)
    gen = torch.Generator(device="cuda").manual_seed(12)
    q, k, v = (torch.randn(total, 2, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    rng = cuda_generator(q.device)
    seed, offset = rng.initial_seed(), rng.get_offset()
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), dropout_p=p, causal=True)
    kept_all = dropout_mask(seed, offset, len(lengths), 2, max(lengths), max(lengths), p, device="cuda")
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(cu[b].item(), cu[b + 1].item())
        kept = kept_all[b : b + 1, :, :n, :n]
        args = [t[rows][None] for t in (q, k, v)]
        o_ref, _ = attention_ref(*(t.float() for t in args), causal=True, dropout_p=p, dropout_mask=kept)
        o_pt, _ = attention_ref(*args, causal=True, dropout_p=p, dropout_mask=kept, upcast=False)
        assert_within_rule(f"out of sequence {b}", out[rows], o_ref[0], o_pt[0])


def test_varlen_probabilities_have_flash_attn_shape():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths = [70, 0, 129, 33]
    q = torch.randn(sum(lengths), 2, head_dim, device="cuda", dtype=dtype)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    _, _, s_dmask = flash_attn_varlen_func(q, q, q, cu, cu, max(lengths), max(lengths), dropout_p=0.2,
                                           return_attn_probs=True)
    assert s_dmask.shape == (len(lengths), 2, 256, 256)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_the_family_that_serves_dropout_is_reported(kernel_family, head_dim):
    """The Hopper family serves dropout where its KV blocks hold whole 64-key Philox calls (all but
    d=192), and never return_attn_probs, whose probabilities only the FA2 family writes."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q = torch.randn(1, 64, 2, head_dim, device="cuda", dtype=dtype)
    ext = _extension.load()
    sm90_dims = ext.built_config()["family_head_dims"].get("sm90", [])
    on_sm90 = kernel_family == "sm90" and head_dim in sm90_dims
    assert ext.fwd_family(q, q, q, None, None, 0, 0, 0.125, False, 0.1) == ("sm90" if on_sm90 and head_dim != 192
                                                                           else "sm80")
    assert ext.fwd_family(q, q, q, None, None, 0, 0, 0.125, False, 0.1, True) == "sm80"
    assert ext.fwd_family(q, q, q, None, None, 0, 0, 0.125, False, 0.0, True) == ("sm90" if on_sm90 else "sm80")


def test_gqa_deterministic_dropout_is_bitwise_reproducible():
    dtype, head_dim = torch.bfloat16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 300, 300, 8, 2, head_dim, dtype, seed=13)
    dout = random_dout(q, 14)
    results = []
    for _ in range(2):
        torch.manual_seed(99)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attn_func(*leaves, dropout_p=0.1, causal=True, deterministic=True)
        results.append((out, *torch.autograd.grad(out, leaves, dout)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, 1.5])
def test_dropout_outside_unit_interval_raises(dropout_p):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        flash_attn_func(q, k, v, dropout_p=dropout_p)


def test_without_dropout_attn_probs_are_an_empty_tensor():
    """flash-attn 2.7 on returns an empty tensor of q's dtype there (2.5-2.6 returned None)."""
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, seed=0)
    skip_unbuilt(64, torch.bfloat16)
    s_dmask = flash_attn_func(q, k, v, return_attn_probs=True)[2]
    assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype and s_dmask.device == q.device
