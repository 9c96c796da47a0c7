"""Random combinations of what flash_attn_func and flash_attn_varlen_func accept (GPU), forward and
backward on each family against the float32 reference under the numerics rule: both dtypes, head
dims on and off the kernels', GQA, seqlen_q != seqlen_k both ways, causal, windows, softcap, ALiBi
(per head or per sequence), dropout, a given softmax_scale, deterministic, varlen with empty
sequences. The other test files take each option in a few chosen combinations; here every case
draws all of them at once. Each case comes from its own seeded generator, so a failure names a
case (its index and arguments) that reproduces. FLASH_ATTN_FUZZ_CASES sets how many cases run
(default 128), for a longer soak on the GPU machine."""

import os
import random

import pytest
import torch

from conftest import (assert_lse_within, assert_within_rule, attention_ref_per_sequence, cu_seqlens_of, poison_allocator,
                      requires_gpu, skip_unbuilt)
from flash_attn_cuda import flash_attn_func, flash_attn_varlen_func
from flash_attn_cuda.dropout import dropout_mask
from flash_attn_cuda.reference import attention_ref

pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.usefixtures("kernel_family")]

NUM_CASES = int(os.environ.get("FLASH_ATTN_FUZZ_CASES", "128"))


def draw_case(index):
    """The arguments of case index. Query lengths start at 2 (varlen: 0 or from 2): one query row
    in bf16 at d=128 is a known miss of the rule (conftest.xfail_single_query_bf16_backward)."""
    rng = random.Random(7919 * index + 1)

    def length(low):
        return rng.choice([rng.randint(low, 64), rng.randint(65, 300), rng.randint(301, 900)])

    varlen = rng.random() < 0.35
    batch = rng.randint(1, 4 if varlen else 3)
    if varlen:
        lengths_q = [0 if rng.random() < 0.15 else length(2) for _ in range(batch)]
        lengths_k = [0 if rng.random() < 0.15 else length(1) for _ in range(batch)]
    else:
        lengths_q, lengths_k = [length(2)] * batch, [length(1)] * batch
    nheads_k = rng.choice([1, 2])
    alibi = rng.choice([None, None, None, "heads", "batch_heads"])
    return dict(
        dtype=rng.choice([torch.bfloat16, torch.float16]),
        head_dim=rng.choice([64, 128, 256, 96, 192, rng.randint(1, 256)]),
        nheads_k=nheads_k,
        nheads=nheads_k * rng.choice([1, 1, 2, 3]),
        varlen=varlen,
        lengths_q=lengths_q,
        lengths_k=lengths_k,
        causal=rng.random() < 0.5,
        window_size=(rng.choice([-1, rng.randint(0, 400)]), rng.choice([-1, rng.randint(0, 400)]))
        if rng.random() < 0.4 else (-1, -1),
        softcap=rng.choice([0.0, 0.0, 0.0, 5.0, 30.0]),
        alibi=alibi,
        dropout_p=rng.choice([0.0, 0.0, 0.0, 0.1, 0.35]),
        softmax_scale=rng.choice([None, None, None, 0.3 * rng.random() + 0.02]),
        deterministic=rng.random() < 0.3,
    )


# Cases of a 1024-case soak (run 288) whose gradients miss the rule on both families, with the same
# errors. 293, 643 and 774 have query rows that see one key: there the standard implementation's dS
# is exactly 0, while FA2's D = rowsum(dO o O) from the 16-bit O (as flash-attn computes it) is off
# by O's rounding (with dropout O = V / (1 - p) is not a 16-bit number); FA2's algorithm in fp32 with
# that D alone gives 4.7-10x the standard implementation's error on their shapes (CPU model,
# benchmarks/NOTES.md). 505 and 782: a CPU model of the algorithm's roundings, run on the very
# inputs of the GPU run (run 291), has the kernel's error at the same element (2.32x and 2.01x);
# fresh draws of their shapes stay within the rule.
KNOWN_OVER_RULE = {
    293: "dk: a sequence with one key, D from the 16-bit O (4.7x)",
    505: "dq 2.3x, FA2 backward at d=192 with softcap: the algorithm's roundings on these inputs",
    643: "dq 2.05x at row 110, which sees one key (causal, fewer keys than queries): D from the 16-bit O",
    774: "dq: one key, D from the 16-bit O (the standard implementation's error is 0)",
    782: "dq 2.01x, FA2 backward at d=96 with ALiBi and dropout: the algorithm's roundings on these inputs",
}


def reference(q, k, v, dout, case, alibi_slopes, kept, upcast):
    """(out, lse, (dq, dk, dv)) of attention_ref, per sequence for varlen (the results concatenated,
    lse as flash_attn_varlen_func gives it: (nheads, total_q))."""
    leaves = [(t.detach().float() if upcast else t.detach().clone()).requires_grad_() for t in (q, k, v)]
    variant = dict(causal=case["causal"], window_size=case["window_size"], softcap=case["softcap"],
                   softmax_scale=case["softmax_scale"], dropout_p=case["dropout_p"], upcast=upcast)
    if not case["varlen"]:
        out, lse = attention_ref(*leaves, alibi_slopes=alibi_slopes, dropout_mask=kept, **variant)
    else:
        lengths_q, lengths_k = case["lengths_q"], case["lengths_k"]

        def variant_of(b):
            slopes = None if alibi_slopes is None else alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes
            kept_b = None if kept is None else kept[b : b + 1, :, : lengths_q[b], : lengths_k[b]]
            return dict(alibi_slopes=slopes, dropout_mask=kept_b)

        # flash-attn normalizes a varlen window with max_seqlen_k.
        out, lse = attention_ref_per_sequence(*leaves, lengths_q, lengths_k, variant_of,
                                              window_seqlen_k=max(lengths_k), **variant)
    grads = torch.autograd.grad(out, leaves, dout.to(out.dtype), allow_unused=True)
    return out.detach(), lse, [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


@pytest.mark.parametrize("index", range(NUM_CASES))
def test_random_case_matches_reference(index, request):
    if index in KNOWN_OVER_RULE:
        request.applymarker(pytest.mark.xfail(reason=f"known miss of the numerics rule: {KNOWN_OVER_RULE[index]}"))
    case = draw_case(index)
    dtype, head_dim, nheads, nheads_k = case["dtype"], case["head_dim"], case["nheads"], case["nheads_k"]
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = case["lengths_q"], case["lengths_k"]
    batch = len(lengths_q)
    gen = torch.Generator(device="cuda").manual_seed(index)

    def randn(rows, heads):
        shape = (sum(rows), heads, head_dim) if case["varlen"] else (batch, rows[0], heads, head_dim)
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    q, k, v = randn(lengths_q, nheads), randn(lengths_k, nheads_k), randn(lengths_k, nheads_k)
    dout = randn(lengths_q, nheads)
    alibi_shape = {None: None, "heads": (nheads,), "batch_heads": (batch, nheads)}[case["alibi"]]
    alibi_slopes = None if alibi_shape is None else 0.3 * torch.rand(*alibi_shape, device="cuda", generator=gen)
    kwargs = dict(causal=case["causal"], window_size=case["window_size"], softcap=case["softcap"],
                  alibi_slopes=alibi_slopes, dropout_p=case["dropout_p"], softmax_scale=case["softmax_scale"],
                  deterministic=case["deterministic"])

    # Dropout draws from the default generator: its (seed, offset) give the mask (flash_attn_cuda.dropout).
    # Without dropout, lse comes back through return_attn_probs (with it, that would send the Hopper
    # forward's problems to the FA2 family, which alone writes the probabilities).
    cuda_gen = torch.cuda.default_generators[q.device.index or 0]
    cuda_gen.manual_seed(index)
    seed, offset = cuda_gen.initial_seed(), cuda_gen.get_offset()
    with_lse = case["dropout_p"] == 0.0
    poison_allocator()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if case["varlen"]:
        result = flash_attn_varlen_func(*leaves, cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k),
                                        max(lengths_q), max(lengths_k),
                                        return_attn_probs=with_lse, **kwargs)
    else:
        result = flash_attn_func(*leaves, return_attn_probs=with_lse, **kwargs)
    out, lse = (result[0], result[1]) if with_lse else (result, None)
    grads = torch.autograd.grad(out, leaves, dout)
    kept = None
    if case["dropout_p"] > 0:
        kept = dropout_mask(seed, offset, batch, nheads, max(lengths_q), max(lengths_k), case["dropout_p"],
                            device="cuda")

    ref_out, ref_lse, ref_grads = reference(q, k, v, dout, case, alibi_slopes, kept, upcast=True)
    pt_out, _, pt_grads = reference(q, k, v, dout, case, alibi_slopes, kept, upcast=False)
    where = f"case {index}: {case}"
    assert out.shape == q.shape and out.dtype == dtype, where
    assert_within_rule(f"out of {where}", out, ref_out, pt_out)
    if with_lse:
        assert_lse_within(lse, ref_lse)
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_within_rule(f"{name} of {where}", g, g_ref, g_pt)
