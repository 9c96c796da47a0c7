"""The attention variants of flash-attn 2.x (sliding window, softcap, ALiBi) against the float32 reference,
forward and backward, under the numerics rule of DESIGN.md (GPU)."""

import pytest
import torch

from conftest import (assert_lse_within, assert_within_rule, dtype_id, grads_of, heads_for_more_tiles_than_sms,
                      lift_key_groups, poison_allocator, random_dout, random_qkv, requires_gpu, skip_unbuilt,
                      xfail_single_query_bf16_backward)
from flash_attn_cuda import flash_attn_func, flash_attn_varlen_func
from flash_attn_cuda.reference import attention_ref

pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.usefixtures("kernel_family")]

# Narrower and wider than a block, one side only, and windows that leave rows with no key.
WINDOWS = [(17, 0), (0, 17), (130, 300), (1000, -1), (-1, 100), (5, 5), (0, 0)]
SEQLENS = [(1, 1), (113, 203), (203, 113), (1000, 1000), (128, 2049), (2049, 128)]


def assert_matches_reference(q, k, v, dout, deterministic=False, **variant):
    """Forward and backward of flash_attn_func with these variant arguments against the float32
    reference, each within the numerics rule (the standard implementation's error in the inputs'
    dtype as the baseline)."""
    poison_allocator()
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn_func(*leaves, return_attn_probs=True, deterministic=deterministic, **variant)
    grads = torch.autograd.grad(out, leaves, dout)
    ref, pt = {}, {}
    for upcast, results in ((True, ref), (False, pt)):
        inputs = [t.detach().float() if upcast else t.detach().clone() for t in (q, k, v)]
        inputs = [t.requires_grad_() for t in inputs]
        o, l = attention_ref(*inputs, upcast=upcast, **variant)
        results["out"], results["lse"] = o, l
        results["grads"] = torch.autograd.grad(o, inputs, dout.to(o.dtype))
    assert_within_rule("out", out, ref["out"], pt["out"])
    assert_lse_within(lse, ref["lse"])
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, ref["grads"], pt["grads"]):
        assert_within_rule(name, g, g_ref, g_pt)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("window", WINDOWS)
def test_window_matches_reference(dtype, head_dim, causal, seqlen_q, seqlen_k, window):
    skip_unbuilt(head_dim, dtype)
    seed = seqlen_q + 7 * seqlen_k + 13 * head_dim + window[0] + 3 * window[1]
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 2, 2, head_dim, dtype, seed=seed)
    assert_matches_reference(q, k, v, random_dout(q, seed + 1), causal=causal, window_size=window)


@pytest.mark.parametrize("window", [(64, 0), (31, 31)])
def test_window_with_gqa_is_deterministic_on_request(window):
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 777, 777, 8, 2, head_dim, dtype, seed=5)
    dout = random_dout(q, 6)
    assert_matches_reference(q, k, v, dout, window_size=window, deterministic=True)
    runs = [grads_of(lambda *t: flash_attn_func(*t, window_size=window, deterministic=True), (q, k, v), dout)[1]
            for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_window_varlen_matches_each_sequence():
    dtype, head_dim, window = torch.bfloat16, 64, (40, 10)
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [300, 0, 17, 129], [250, 5, 0, 400]
    gen = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    cu = [torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), device="cuda", dtype=torch.int32)
          for n in (lengths_q, lengths_k)]
    out = flash_attn_varlen_func(q, k, v, cu[0], cu[1], max(lengths_q), max(lengths_k), window_size=window)
    for b, (q_b, k_b, v_b) in enumerate(zip(q.split(lengths_q), k.split(lengths_k), v.split(lengths_k))):
        if not len(q_b):
            continue
        o_ref, _ = attention_ref(q_b[None].float(), k_b[None].float(), v_b[None].float(), window_size=window)
        o_pt, _ = attention_ref(q_b[None], k_b[None], v_b[None], window_size=window, upcast=False)
        assert_within_rule(f"out of sequence {b}", out.split(lengths_q)[b], o_ref[0], o_pt[0])


@pytest.mark.parametrize("window", [(-2, 0), (0, -5)])
def test_bad_window_raises(window):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=window)


SCORE_MODS = [{"softcap": 30.0}, {"softcap": 4.0}, {"alibi": "head"}, {"alibi": "batch"}, {"softcap": 10.0, "alibi": "head"}]


def alibi_slopes(kind, batch, nheads, seed):
    """Slopes of the kind (one per head, or per batch and head), as BLOOM-style geometric values
    with random jitter."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    base = 2.0 ** (-8.0 * torch.arange(1, nheads + 1, device="cuda") / nheads)
    shape = (nheads,) if kind == "head" else (batch, nheads)
    return (base * (0.5 + torch.rand(shape, device="cuda", generator=gen))).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 129), (113, 203), (203, 113), (1000, 1000)])
@pytest.mark.parametrize("window", [(-1, -1), (64, 32)])
@pytest.mark.parametrize("mod", range(len(SCORE_MODS)))
def test_softcap_and_alibi_match_reference(dtype, head_dim, causal, seqlen_q, seqlen_k, window, mod, request):
    skip_unbuilt(head_dim, dtype)
    if (dtype, head_dim, seqlen_q, seqlen_k, window, SCORE_MODS[mod]) == (torch.bfloat16, 128, 1, 129, (-1, -1),
                                                                          {"alibi": "batch"}):
        xfail_single_query_bf16_backward(request)
    seed = seqlen_q + 3 * seqlen_k + head_dim + 17 * mod
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, seed=seed)
    variant = {"causal": causal, "window_size": window, "softcap": SCORE_MODS[mod].get("softcap", 0.0)}
    if "alibi" in SCORE_MODS[mod]:
        variant["alibi_slopes"] = alibi_slopes(SCORE_MODS[mod]["alibi"], 2, 4, seed)
    assert_matches_reference(q, k, v, random_dout(q, seed + 1), **variant)


@pytest.mark.parametrize("causal,seqlen_q,seqlen_k", [(False, 576, 700), (True, 2100, 2300)])
@pytest.mark.parametrize("mod", [{"softcap": 10.0}, {"alibi": "batch"}, {"softcap": 4.0, "alibi": "head"}])
def test_score_mods_on_tall_tiles_match_reference(causal, seqlen_q, seqlen_k, mod):
    """At d=64 the Hopper forward runs softcap and ALiBi on its 192-row tiles where they pay:
    non-causal with enough tiles (64 sequences of 576 rows here), causal from 2k rows however few
    (csrc/sm90/fwd_tile_config.h); a window on the causal problem."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    batch, nheads = (4, 16) if not causal else (1, 2)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads // 2, head_dim, dtype, seed=seqlen_q + len(mod))
    variant = {"causal": causal, "softcap": mod.get("softcap", 0.0)}
    if causal:
        variant["window_size"] = (900, 0)
    if "alibi" in mod:
        variant["alibi_slopes"] = alibi_slopes(mod["alibi"], batch, nheads, seed=5)
    assert_matches_reference(q, k, v, random_dout(q, 6), **variant)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("variant", [{"causal": True, "alibi": "head"}, {"softcap": 30.0},
                                     {"causal": True, "window_size": (700, 0)}, {"window_size": (300, 200)},
                                     {"window_size": (300, 200), "softcap": 8.0}])
def test_running_max_jumps_with_variants(dtype, head_dim, variant):
    """Large jumps of the running max with the variants: windows, whose left edge the Hopper
    forward meets after its rows take their exponentials at the current max (and redo a block whose
    max outgrows it, csrc/sm90/fwd_consumer.h), causal ALiBi, which takes them too, and softcap,
    which keeps the exact max. K's 64-key groups lift their scores by up to 150
    (conftest.lift_key_groups). Forward only: out and lse."""
    skip_unbuilt(head_dim, dtype)
    seqlen_q, seqlen_k = 1100, 1300
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 4, head_dim, dtype, seed=head_dim + len(variant))
    lift_key_groups(q, k, 150, seed=head_dim)
    variant = dict(variant)
    if "alibi" in variant:
        variant["alibi_slopes"] = alibi_slopes(variant.pop("alibi"), 2, 4, seed=head_dim)
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **variant)
    out_ref, lse_ref = attention_ref(q.float(), k.float(), v.float(), **variant)
    out_pt, _ = attention_ref(q, k, v, upcast=False, **variant)
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("softcap", [31.0, 50.0])
def test_softcap_rows_far_below_the_cap(dtype, head_dim, causal, softcap):
    """Every other query row scores about -1.5 softcap against every key (tanh near -1 for all of
    them), so that its largest exponential lies far below the one at the cap: a softmax taking its
    exponentials at a fixed m from softcap's bound, instead of the rows' own max, flushes such rows
    at softcap 50 (benchmarks/NOTES.md, run 299)."""
    skip_unbuilt(head_dim, dtype)
    seqlen = 700
    q, k, v = random_qkv(2, seqlen, seqlen, 4, 4, head_dim, dtype, seed=head_dim + int(softcap) + causal)
    k[..., 0] = 4.0
    q[:, ::2, :, 0] = -1.5 * softcap * head_dim**0.5 / 4.0
    assert_matches_reference(q, k, v, random_dout(q, 9), causal=causal, softcap=softcap)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("variant", [{}, {"window_size": (100, 50)}, {"causal": True, "window_size": (150, 0)},
                                     {"softcap": 10.0, "alibi": "head"}])
def test_more_tiles_than_sms_match_reference(head_dim, variant):
    """Where its tiles cost alike (not causal, or a bounded left window), the Hopper backward walks
    several tiles per block, reusing its K and V buffers: problems with more tiles than that."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    nheads = heads_for_more_tiles_than_sms(2, 3)
    q, k, v = random_qkv(2, 200, 300, nheads, nheads, head_dim, dtype, seed=head_dim + len(variant))
    variant = dict(variant)
    if variant.pop("alibi", None):
        variant["alibi_slopes"] = alibi_slopes("head", 2, nheads, seed=3)
    assert_matches_reference(q, k, v, random_dout(q, 4), **variant)


@pytest.mark.parametrize(
    "variant,error,match",
    [
        ({"softcap": -1.0}, ValueError, "softcap"),
        ({"alibi_slopes": torch.ones(3)}, ValueError, "alibi_slopes must have shape"),
        ({"alibi_slopes": torch.ones(2, dtype=torch.float16)}, TypeError, "float32"),
        ({"alibi_slopes": "cpu"}, ValueError, "device of q"),
    ],
)
def test_bad_softcap_and_alibi_raise(variant, error, match):
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, seed=0)
    if isinstance(variant.get("alibi_slopes"), torch.Tensor):
        variant = {"alibi_slopes": variant["alibi_slopes"].cuda()}
    elif variant.get("alibi_slopes") == "cpu":
        variant = {"alibi_slopes": torch.ones(2)}
    with pytest.raises(error, match=match):
        flash_attn_func(q, k, v, **variant)


@pytest.mark.parametrize("view", ["expanded", "strided rows"])
def test_per_batch_alibi_slopes_need_only_contiguous_heads(view):
    """As flash-attn, (batch, nheads) slopes may have any batch stride: a view expanded over the
    batch (stride 0) or every other row of a taller tensor gives bitwise what the same slopes give
    contiguous, forward and backward."""
    skip_unbuilt(64, torch.bfloat16)
    batch, nheads = 3, 4
    q, k, v = random_qkv(batch, 100, 130, nheads, nheads, 64, torch.bfloat16, seed=7)
    base = alibi_slopes("batch", 2 * batch, nheads, seed=5)
    slopes = base[:1].expand(batch, nheads) if view == "expanded" else base[::2]
    assert not slopes.is_contiguous()
    dout = random_dout(q, 8)
    strided = grads_of(lambda *t: flash_attn_func(*t, causal=True, alibi_slopes=slopes), (q, k, v), dout)
    dense = grads_of(lambda *t: flash_attn_func(*t, causal=True, alibi_slopes=slopes.contiguous()), (q, k, v), dout)
    assert torch.equal(strided[0], dense[0])
    for a, b in zip(strided[1], dense[1]):
        assert torch.equal(a, b)


def test_alibi_slopes_with_strided_heads_raise():
    q, k, v = random_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(4, device="cuda")[::2])
