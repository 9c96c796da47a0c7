"""flash_attn_varlen_func and its packed variants: against the reference run per sequence (GPU),
against the padded path, and the checks of cu_seqlens (CPU and GPU)."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import (
    assert_compiled_grads_equal_eager,
    assert_within_rule,
    attention_ref_per_sequence,
    cu_seqlens_of,
    dtype_id,
    grads_of,
    poison_allocator,
    requires_gpu,
    skip_unbuilt,
)
from flash_attn_cuda import (
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flash_attn_cuda import _extension
from flash_attn_cuda.checks import check_cu_seqlens_values
from flash_attn_cuda.dropout import dropout_mask
from flash_attn_cuda.reference import attention_ref


def random_varlen(lengths_q, lengths_k, nheads, nheads_k, head_dim, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    q = randn(sum(lengths_q), nheads, head_dim)
    k = randn(sum(lengths_k), nheads_k, head_dim)
    v = randn(sum(lengths_k), nheads_k, head_dim)
    dout = randn(sum(lengths_q), nheads, head_dim)
    return q, k, v, dout


def reference_per_sequence(q, k, v, dout, lengths_q, lengths_k, causal, variant_of=lambda b: {}):
    """(out, dq, dk, dv) in float32 and in the inputs' dtype (the standard implementation), each
    sequence computed on its own (with attention_ref's variant arguments variant_of(b) for
    sequence b) and the results concatenated."""
    results = {True: [], False: []}
    for upcast in (True, False):
        leaves = [t.detach().float().requires_grad_() if upcast else t.detach().clone().requires_grad_()
                  for t in (q, k, v)]
        out, _ = attention_ref_per_sequence(*leaves, lengths_q, lengths_k, variant_of, causal=causal, upcast=upcast)
        grads = torch.autograd.grad(out, leaves, dout.float() if upcast else dout, allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]
        results[upcast] = [out.detach(), *grads]
    return results[True], results[False]


def varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal, extra_max_seqlen=0, **kwargs):
    """[out, dq, dk, dv] of flash_attn_varlen_func, max_seqlen being the longest sequence plus
    extra_max_seqlen."""
    out, grads = grads_of(
        lambda *qkv: flash_attn_varlen_func(*qkv, cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k),
                                            max(lengths_q) + extra_max_seqlen, max(lengths_k) + extra_max_seqlen,
                                            causal=causal, **kwargs),
        (q, k, v), dout)
    return [out, *grads]


def assert_varlen_matches_reference(lengths_q, lengths_k, nheads, nheads_k, head_dim, dtype, causal, seed):
    """out, dq, dk and dv of flash_attn_varlen_func on fresh random inputs against the reference
    run per sequence, under the numerics rule."""
    q, k, v, dout = random_varlen(lengths_q, lengths_k, nheads, nheads_k, head_dim, dtype, seed=seed)
    expected_ref, expected_pt = reference_per_sequence(q, k, v, dout, lengths_q, lengths_k, causal)
    poison_allocator()
    results = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal)
    for name, value, ref, pt in zip(("out", "dq", "dk", "dv"), results, expected_ref, expected_pt):
        assert value.shape == ref.shape and value.dtype == dtype, name
        assert_within_rule(name, value, ref, pt)


# Per-sequence lengths, including 0, 1, one of the maximum and lengths off the block sizes; the
# last at most 64 rows per sequence against up to 3000 keys (the Hopper forward's split-block
# kernels, csrc/sm90/fwd_split_blocks.h), with sequences of no keys and of no rows.
LENGTHS = [
    ([1, 300, 0, 77, 512], [1, 300, 0, 77, 512]),
    ([130, 1, 257, 0, 64], [33, 200, 257, 5, 0]),
    ([1000, 3, 129], [17, 1100, 129]),
    ([1, 64, 0, 5, 3, 40], [3000, 700, 250, 0, 129, 1]),
]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("head_dim", [40, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nheads,nheads_k", [(4, 4), (6, 2)])
@pytest.mark.parametrize("lengths", range(len(LENGTHS)))
def test_varlen_matches_reference(dtype, head_dim, causal, nheads, nheads_k, lengths, kernel_family):
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = LENGTHS[lengths]
    assert_varlen_matches_reference(lengths_q, lengths_k, nheads, nheads_k, head_dim, dtype, causal,
                                    seed=lengths + head_dim)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("variant", ["window", "softcap_alibi", "dropout"])
def test_varlen_variants_match_reference(head_dim, variant, kernel_family):
    """Gradients too: the Hopper backward serves varlen with the variants (forced here also where the
    default leaves these short problems to the FA2 family); sequences of several Q and KV blocks, empty
    ones and ones without keys."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [300, 0, 17, 129, 1], [250, 5, 0, 400, 77]
    nheads, nheads_k, batch = 4, 2, len(lengths_q)
    q, k, v, dout = random_varlen(lengths_q, lengths_k, nheads, nheads_k, head_dim, dtype, seed=head_dim + 17)
    causal = variant != "window"
    if variant == "window":
        kwargs = dict(window_size=(40, 10))
    elif variant == "softcap_alibi":
        kwargs = dict(softcap=20.0, alibi_slopes=torch.rand(batch, nheads, device="cuda"))
    else:
        kwargs = dict(dropout_p=0.2)
        generator = torch.cuda.default_generators[q.device.index or 0]
        seed, offset = generator.initial_seed(), generator.get_offset()
    poison_allocator()
    results = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal, **kwargs)

    def variant_of(b):
        if variant == "softcap_alibi":
            return dict(softcap=20.0, alibi_slopes=kwargs["alibi_slopes"][b : b + 1])
        if variant == "dropout":
            kept = dropout_mask(seed, offset, batch, nheads, max(lengths_q), max(lengths_k), 0.2, device="cuda")
            return dict(dropout_p=0.2, dropout_mask=kept[b : b + 1, :, : lengths_q[b], : lengths_k[b]])
        return kwargs

    expected_ref, expected_pt = reference_per_sequence(q, k, v, dout, lengths_q, lengths_k, causal, variant_of)
    for name, value, ref, pt in zip(("out", "dq", "dk", "dv"), results, expected_ref, expected_pt):
        assert_within_rule(name, value, ref, pt)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_causal_backward_with_several_tiles_per_block(head_dim, kernel_family):
    """Causal varlen tiles (10 KV blocks x 12 heads x 5 sequences), several per block of the Hopper
    backward's persistent grid, taken from its counter (csrc/sm90/tile_queue.h); the tiles past a
    short or empty sequence's keys have no work and hand their counter's indices on at once; GQA."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [1200, 0, 37, 600, 1], [1250, 5, 37, 580, 0]
    assert_varlen_matches_reference(lengths_q, lengths_k, 12, 4, head_dim, dtype, causal=True, seed=head_dim + 7)


@pytest.mark.gpu
@requires_gpu
def test_varlen_causal_with_a_long_sequence_matches_reference(kernel_family):
    """One sequence of 8k+ query rows puts the whole causal batch on the Hopper family's 192-row
    tiles at d=64 (csrc/sm90/fwd_launch.h); every sequence starts mid-tile (causal tiles end with
    their sequence, csrc/sm90/tile_work.h), so that the rows above it, which must not be written,
    are the previous sequence's."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [5, 8300, 0, 211], [9, 8250, 3, 300]
    q, k, v, _ = random_varlen(lengths_q, lengths_k, 2, 1, head_dim, dtype, seed=83)
    poison_allocator()
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k), max(lengths_q),
                                 max(lengths_k), causal=True)
    refs = {}
    for upcast in (True, False):
        refs[upcast] = torch.cat([
            attention_ref(q_b[None], k_b[None], v_b[None], causal=True, upcast=upcast)[0][0]
            for q_b, k_b, v_b in zip(q.split(lengths_q), k.split(lengths_k), v.split(lengths_k))])
    assert_within_rule("out", out, refs[True], refs[False])


@pytest.mark.gpu
@requires_gpu
def test_varlen_single_queries_causal_is_non_causal(kernel_family):
    """A decoding step over a padded batch (one query per sequence, max_seqlen_q = 1): causal=True
    gives the non-causal reference of each sequence."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [1, 1, 1, 1], [2, 257, 1, 40]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 8, 2, head_dim, dtype, seed=3)
    expected_ref, expected_pt = reference_per_sequence(q, k, v, dout, lengths_q, lengths_k, causal=False)
    results = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal=True)
    for name, value, ref, pt in zip(("out", "dq", "dk", "dv"), results, expected_ref, expected_pt):
        assert_within_rule(name, value, ref, pt)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_of_equal_lengths_equals_padded(causal):
    """The same tiles in the same order: bitwise equal outputs, lse and (deterministic) gradients."""
    dtype, head_dim, batch, seqlen = torch.bfloat16, 64, 3, 333
    skip_unbuilt(head_dim, dtype)
    q, k, v, dout = random_varlen([seqlen] * batch, [seqlen] * batch, 4, 2, head_dim, dtype, seed=5)
    cu = cu_seqlens_of([seqlen] * batch)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn_varlen_func(*leaves, cu, cu, seqlen, seqlen, causal=causal, deterministic=True,
                                         return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    padded = [t.detach().view(batch, seqlen, *t.shape[1:]).clone().requires_grad_() for t in (q, k, v)]
    out_p, lse_p, _ = flash_attn_func(*padded, causal=causal, deterministic=True, return_attn_probs=True)
    grads_p = torch.autograd.grad(out_p, padded, dout.view(batch, seqlen, *dout.shape[1:]))
    assert torch.equal(out, out_p.flatten(0, 1))
    assert lse.shape == (4, batch * seqlen)
    assert torch.equal(lse, lse_p.transpose(0, 1).flatten(1))
    for name, g, g_p in zip(("dq", "dk", "dv"), grads, grads_p):
        assert torch.equal(g, g_p.flatten(0, 1)), name


@pytest.mark.gpu
@requires_gpu
def test_varlen_deterministic_is_bitwise_reproducible(kernel_family):
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [700, 0, 1300, 9], [1500, 3, 1300, 0]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, head_dim, dtype, seed=6)
    first = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, True, deterministic=True)
    for _ in range(3):
        again = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, True, deterministic=True)
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), name


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nheads_k", [4, 2])
def test_varlen_packed_variants_match_unpacked(causal, nheads_k, kernel_family):
    """Bitwise equal to the unpacked function; with GQA (nheads_k 2) the backward sums each group's
    dk, dv into the views of the packed gradient."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [45, 0, 300, 1], [60, 7, 280, 0]
    if nheads_k == 4:
        lengths_k = lengths_q
    cu_q, cu_k = cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k)
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, nheads_k, head_dim, dtype, seed=7)
    unpacked = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal, deterministic=True)

    out, (dq, dkv) = grads_of(
        lambda q_, kv: flash_attn_varlen_kvpacked_func(q_, kv, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                       causal=causal, deterministic=True),
        (q, torch.stack([k, v], dim=1)), dout)
    assert torch.equal(out, unpacked[0])
    assert torch.equal(dq, unpacked[1]) and torch.equal(dkv, torch.stack(unpacked[2:], dim=1))

    if nheads_k == 4:
        out, (dqkv,) = grads_of(
            lambda qkv: flash_attn_varlen_qkvpacked_func(qkv, cu_q, max(lengths_q), causal=causal,
                                                         deterministic=True),
            (torch.stack([q, k, v], dim=1),), dout)
        assert torch.equal(out, unpacked[0])
        assert torch.equal(dqkv, torch.stack(unpacked[1:], dim=1))


@pytest.mark.gpu
@requires_gpu
def test_varlen_torch_compile_fullgraph():
    """Under torch.compile the offsets are not read back (no sync, no graph break)."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths = [100, 3, 250]
    cu = cu_seqlens_of(lengths)
    q, k, v, _ = random_varlen(lengths, lengths, 4, 2, head_dim, dtype, seed=8)

    def loss_fn(q, k, v):
        out = flash_attn_varlen_func(q, k, v, cu, cu, 250, 250, causal=True, deterministic=True)
        return out.float().square().sum()

    assert_compiled_grads_equal_eager(loss_fn, (q, k, v))


@pytest.mark.gpu
@requires_gpu
def test_varlen_compiled_keeps_max_seqlen_symbolic():
    """torch.compile(dynamic=True) of the public function: batches with other lengths and another
    max_seqlen run the same graph, and give eager's output."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(flash_attn_varlen_func, backend=counter, dynamic=True, fullgraph=True)
    for seed, lengths in enumerate(([100, 3, 250], [17, 190, 64], [300, 1, 5])):
        cu = cu_seqlens_of(lengths)
        q, k, v, _ = random_varlen(lengths, lengths, 4, 2, head_dim, dtype, seed=20 + seed)
        args = (q, k, v, cu, cu, max(lengths), max(lengths))
        assert torch.equal(compiled(*args, causal=True), flash_attn_varlen_func(*args, causal=True))
    assert counter.frame_count == 1


@pytest.mark.gpu
@requires_gpu
def test_varlen_bad_inputs_raise():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths = [10, 20]
    q, k, v, _ = random_varlen(lengths, lengths, 4, 2, head_dim, dtype, seed=9)
    cu = cu_seqlens_of(lengths)
    with pytest.raises(TypeError, match="int32"):
        flash_attn_varlen_func(q, k, v, cu.long(), cu, 20, 20)
    with pytest.raises(ValueError, match="device"):
        flash_attn_varlen_func(q, k, v, cu.cpu(), cu, 20, 20)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        flash_attn_varlen_func(q, k, v, cu, cu_seqlens_of([30]), 20, 30)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flash_attn_varlen_func(q, k, v, cu, cu, 20, 19)
    with pytest.raises(ValueError, match="multiple of nheads_k"):
        flash_attn_varlen_func(q[:, :3], k, v, cu, cu, 20, 20)
    with pytest.raises(ValueError, match="total_q, nheads, head_dim"):
        flash_attn_varlen_func(q[:, None], k, v, cu, cu, 20, 20)


def check(lengths_or_offsets_q, offsets_k=None, max_q=100, max_k=100, total_q=None, total_k=None, dtype=torch.int32):
    cu_q = torch.tensor(lengths_or_offsets_q, dtype=dtype)
    cu_k = cu_q if offsets_k is None else torch.tensor(offsets_k, dtype=dtype)
    total_q = int(cu_q[-1]) if total_q is None else total_q
    total_k = int(cu_k[-1]) if total_k is None else total_k
    check_cu_seqlens_values(cu_q, cu_k, max_q, max_k, total_q, total_k)


def test_cu_seqlens_checks_accept_valid_offsets():
    check([0, 5, 5, 12], [0, 0, 7, 7], max_q=7, max_k=7)
    check([0])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"lengths_or_offsets_q": [0, 5, 3]}, "non-decreasing"),
        ({"lengths_or_offsets_q": [2, 5]}, "start at 0"),
        ({"lengths_or_offsets_q": [0, 5], "total_q": 4}, "end at the number of tokens"),
        ({"lengths_or_offsets_q": [0, 5], "total_q": 6}, "end at the number of tokens"),
        ({"lengths_or_offsets_q": [0, 5, 9], "max_q": 4}, "max_seqlen_q \\(4\\)"),
        ({"lengths_or_offsets_q": [0, 5], "offsets_k": [0, 8], "max_k": 7}, "max_seqlen_k \\(7\\)"),
    ],
)
def test_cu_seqlens_checks_reject_bad_offsets(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check(**kwargs)


def varlen_on_cpu(cu_seqlens_q, cu_seqlens_k, max_seqlen_q=8, max_seqlen_k=8):
    """flash_attn_varlen_func on CPU tensors of 8 tokens: the op checks the offsets' kind, then
    raises for the device."""
    q = torch.randn(8, 2, 64, dtype=torch.bfloat16)
    return flash_attn_varlen_func(q, q, q, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


@pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")
@pytest.mark.parametrize(
    "cu_q,cu_k,max_q,max_k,error,match",
    [
        ([0, 8], None, 8, 8, ValueError, "CUDA tensor"),
        (torch.tensor([0, 8]), None, 8, 8, TypeError, "int32"),
        ([[0, 8]], None, 8, 8, ValueError, "1-D"),
        ([0, 4, 8], [0, 8], 8, 8, ValueError, "length of cu_seqlens_q"),
        ([0, 8], None, 2**30, 8, ValueError, "max_seqlen_q and max_seqlen_k must be in"),
        ([0, 8], None, 8, 2**30, ValueError, "max_seqlen_q and max_seqlen_k must be in"),
    ],
)
def test_the_op_checks_the_kind_of_cu_seqlens(cu_q, cu_k, max_q, max_k, error, match):
    as_tensor = lambda x: x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.int32)
    cu_q = as_tensor(cu_q)
    cu_k = cu_q if cu_k is None else as_tensor(cu_k)
    with pytest.raises(error, match=match):
        varlen_on_cpu(cu_q, cu_k, max_q, max_k)


@pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")
def test_varlen_packed_shapes_are_checked():
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="3 parts"):
        flash_attn_varlen_qkvpacked_func(torch.randn(8, 2, 2, 64), cu, 8)
    with pytest.raises(ValueError, match="2 parts"):
        flash_attn_varlen_kvpacked_func(torch.randn(8, 2, 64), torch.randn(8, 3, 2, 64), cu, cu, 8, 8)


@pytest.fixture
def reads(monkeypatch):
    """Records each read of a tensor back to the host (tolist)."""
    calls = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: calls.append(1) or real_tolist(t))
    return calls


def test_cu_seqlens_are_read_once_until_modified(reads):
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    for _ in range(3):
        check_cu_seqlens_values(cu, cu, 7, 7, 12, 12)
    assert len(reads) == 1
    cu[1] = 6
    check_cu_seqlens_values(cu, cu, 7, 7, 12, 12)
    assert len(reads) == 2
    cu[2] = 11
    with pytest.raises(ValueError, match="end at the number of tokens"):
        check_cu_seqlens_values(cu, cu, 7, 7, 12, 12)
    with pytest.raises(ValueError, match="end at the number of tokens"):
        check_cu_seqlens_values(cu, cu, 7, 7, 12, 12)


def test_cu_seqlens_shared_by_q_and_k_with_different_max_seqlen_are_read_once(reads):
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    for _ in range(3):
        check_cu_seqlens_values(cu, cu, 7, 8, 12, 12)
    assert len(reads) == 2


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_max_seqlen_above_the_longest_sequence(causal):
    """A larger max_seqlen only adds thread blocks that find no rows: the same bits."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [70, 0, 200], [130, 5, 90]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, head_dim, dtype, seed=10)
    results = [varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal, extra, deterministic=True)
               for extra in (0, 300)]
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_without_query_rows_has_zero_gradients(head_dim, kernel_family):
    """Every sequence without queries (q has no rows) while max_seqlen_q says 1: an empty output,
    dk and dv zero, on each family (the Hopper one cannot describe an empty q to its TMA)."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [0, 0], [5, 70]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, head_dim, dtype, seed=11)
    out, dq, dk, dv = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal=False, extra_max_seqlen=1)
    torch.cuda.synchronize()
    assert out.shape == q.shape == dq.shape == (0, 4, head_dim)
    assert torch.count_nonzero(dk) == 0 and torch.count_nonzero(dv) == 0
    assert dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_sequences_are_isolated_from_their_neighbours(head_dim, causal, kernel_family):
    """NaN in one sequence's q, k, v and dout and inf in another's leave the remaining sequences'
    outputs and gradients bitwise as they are with finite values there. A tile that ends inside a KV
    block or a Q block covers a neighbour's rows; only zeros there keep 0 * NaN out of the GEMMs."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [100, 37, 200, 20], [150, 60, 90, 70]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, head_dim, dtype, seed=19)
    clean = varlen_out_and_grads(q, k, v, dout, lengths_q, lengths_k, causal, deterministic=True)
    dirty = varlen_out_and_grads(*poisoned_neighbours((q, k, v, dout), lengths_q, lengths_k), lengths_q, lengths_k,
                                 causal, deterministic=True)
    rows_q, rows_k = rows_of_clean_sequences(lengths_q), rows_of_clean_sequences(lengths_k)
    for name, a, b, rows in zip(("out", "dq", "dk", "dv"), clean, dirty, (rows_q, rows_q, rows_k, rows_k)):
        assert torch.isfinite(b[rows]).all(), f"{name}: a neighbour's NaN or inf came in"
        assert torch.equal(a[rows], b[rows]), name


def poisoned_neighbours(tensors, lengths_q, lengths_k):
    """q, k, v and dout with NaN in sequence 1 and inf in sequence 3 and past it."""
    def poisoned(t, lengths):
        t = t.clone()
        t[lengths[0]:sum(lengths[:2])] = float("nan")
        t[sum(lengths[:3]):] = float("inf")
        return t
    return [poisoned(t, lengths) for t, lengths in zip(tensors, (lengths_q, lengths_k, lengths_k, lengths_q))]


def rows_of_clean_sequences(lengths):
    """The rows of sequences 0 and 2, which poisoned_neighbours leaves finite."""
    return torch.cat([torch.arange(lengths[0]), torch.arange(sum(lengths[:2]), sum(lengths[:3]))]).cuda()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_decoding_rows_are_isolated_from_their_neighbours(head_dim, causal, kernel_family):
    """At most 64 rows per sequence against more keys (the Hopper forward's split-block kernels,
    which zero V's rows past a sequence in shared memory): NaN and inf in the neighbours leave the
    other sequences' outputs finite and within the rule of the reference run on them alone. Not
    bitwise: their rows share a warpgroup with the neighbour's, whose NaN scores make the softmax
    steps at the current max redo a block at the exact max (common/softmax.h), which rounds a little
    differently."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    lengths_q, lengths_k = [1, 64, 17, 5], [300, 600, 257, 1000]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, head_dim, dtype, seed=23)
    expected_ref, expected_pt = reference_per_sequence(q, k, v, dout, lengths_q, lengths_k, causal)
    dirty = varlen_out_and_grads(*poisoned_neighbours((q, k, v, dout), lengths_q, lengths_k), lengths_q, lengths_k,
                                 causal)
    rows_q, rows_k = rows_of_clean_sequences(lengths_q), rows_of_clean_sequences(lengths_k)
    for name, value, ref, pt, rows in zip(("out", "dq", "dk", "dv"), dirty, expected_ref, expected_pt,
                                          (rows_q, rows_q, rows_k, rows_k)):
        assert torch.isfinite(value[rows]).all(), f"{name}: a neighbour's NaN or inf came in"
        assert_within_rule(name, value[rows], ref[rows], pt[rows])


def paged(k, lengths, page, seed):
    """k (total_k, nheads_k, d) of sequences of these lengths laid into pages of a cache of shuffled
    blocks (and two spare ones): (pages, block_table, rows of the pages' flat rows in k's order)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = max((n + page - 1) // page for n in lengths)
    order = torch.randperm(len(lengths) * blocks + 2, generator=gen)
    table = order[: len(lengths) * blocks].reshape(len(lengths), blocks)
    rows = torch.cat([table[b, torch.arange(n) // page] * page + torch.arange(n) % page for b, n in enumerate(lengths)])
    pages = torch.zeros(len(order) * page, *k.shape[1:], dtype=k.dtype, device=k.device)
    pages[rows.to(k.device)] = k
    return pages.reshape(len(order), page, *k.shape[1:]), table.to(torch.int32).to(k.device), rows.to(k.device)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_paged_keys_equal_packed(causal):
    """block_table: the same output and gradients as the keys packed, bitwise (deterministic, so
    that dq's adds come in one order); the gradients reach the pages' rows and nothing else."""
    skip_unbuilt(64, torch.bfloat16)
    lengths_q, lengths_k = [3, 0, 200, 129], [5, 0, 300, 256]
    q, k, v, dout = random_varlen(lengths_q, lengths_k, 4, 2, 64, torch.bfloat16, seed=11)
    k_pages, table, rows = paged(k, lengths_k, 128, seed=1)
    v_pages, _, _ = paged(v, lengths_k, 128, seed=1)
    cu_q, cu_k = cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k_pages, v_pages)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, 200, 300, causal=causal, deterministic=True,
                                 block_table=table)
    dq, dk_pages, dv_pages = torch.autograd.grad(out, leaves, dout)
    packed = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_packed = flash_attn_varlen_func(*packed, cu_q, cu_k, 200, 300, causal=causal, deterministic=True)
    grads = torch.autograd.grad(out_packed, packed, dout)
    assert torch.equal(out, out_packed) and torch.equal(dq, grads[0])
    for pages_grad, packed_grad in ((dk_pages, grads[1]), (dv_pages, grads[2])):
        flat = pages_grad.flatten(0, 1)
        assert torch.equal(flat[rows], packed_grad)
        untouched = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
        untouched[rows] = False
        assert not flat[untouched].any()


@pytest.mark.parametrize("change,match", [
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), "block_table must be int32"),
    (dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), "block_table must be int32"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "exceeds what block_table holds"),
    (dict(block_table=torch.tensor([[0, 1, 2], [3, 4, 9]], dtype=torch.int32)), "outside"),
    (dict(k=torch.zeros(8, 2, 2, 16)), "of one shape"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 6]), cu_seqlens_k=cu_seqlens_of([10, 400], "cpu")), "smaller than a sequence"),
])
def test_varlen_bad_block_table_raises(change, match):
    args = dict(q=torch.zeros(6, 2, 16), k=torch.zeros(8, 128, 2, 16), v=torch.zeros(8, 128, 2, 16),
                cu_seqlens_q=cu_seqlens_of([3, 3], "cpu"), cu_seqlens_k=cu_seqlens_of([10, 300], "cpu"),
                max_seqlen_q=3, max_seqlen_k=300, block_table=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        flash_attn_varlen_func(**args)
