"""The backward pass (dq, dk, dv) against the float32 reference, under the numerics rule of
DESIGN.md; determinism, races, autograd and torch.compile (GPU)."""

import math

import pytest
import torch

from conftest import (
    assert_compiled_grads_equal_eager,
    assert_within_rule,
    dtype_id,
    grads_of,
    heads_for_more_tiles_than_sms,
    peak_extra_bytes,
    poison_allocator,
    random_dout,
    random_qkv,
    requires_gpu,
    skip_unbuilt,
    xfail_single_query_bf16_backward,
)
from flash_attn_cuda import _extension, flash_attn_func
from flash_attn_cuda.reference import attention_ref

pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.usefixtures("kernel_family")]

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 64, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [(1, 1), (1, 113), (113, 203), (203, 113), (256, 256), (1000, 1000), (2049, 1000), (128, 2049)]


def reference_grads(q, k, v, dout, causal, softmax_scale=None):
    """((dq, dk, dv) in float32 from the same low-precision inputs, (dq, dk, dv) of the standard
    implementation in the inputs' dtype)."""
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out_ref, _ = attention_ref(q32, k32, v32, causal=causal, softmax_scale=softmax_scale)
    grads_ref = torch.autograd.grad(out_ref, (q32, k32, v32), dout.float())
    q_lp, k_lp, v_lp = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out_pt, _ = attention_ref(q_lp, k_lp, v_lp, causal=causal, softmax_scale=softmax_scale, upcast=False)
    grads_pt = torch.autograd.grad(out_pt, (q_lp, k_lp, v_lp), dout)
    return grads_ref, grads_pt


def flash_grads(q, k, v, dout, causal, **kwargs):
    return grads_of(lambda *qkv: flash_attn_func(*qkv, causal=causal, **kwargs), (q, k, v), dout)[1]


def assert_grads_within_rule(grads, q, k, v, dout, causal, softmax_scale=None):
    grads_ref, grads_pt = reference_grads(q, k, v, dout, causal, softmax_scale)
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt):
        assert g.shape == g_ref.shape and g.dtype == q.dtype, name
        assert_within_rule(name, g, g_ref, g_pt)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_backward_matches_reference(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unbuilt(head_dim, dtype)
    seed = seqlen_q * 3 + seqlen_k + head_dim
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 3, 3, head_dim, dtype, seed=seed)
    dout = random_dout(q, seed + 1)
    poison_allocator()
    grads = flash_grads(q, k, v, dout, causal)
    assert_grads_within_rule(grads, q, k, v, dout, causal)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(900, 1100), (1100, 900)])
def test_causal_backward_with_more_tiles_than_sms(head_dim, seqlen_q, seqlen_k):
    """Causal tiles, several per block of the Hopper backward's persistent grid, which the blocks
    take from a counter (csrc/sm90/tile_queue.h); GQA, the causal diagonal shifted both ways, and
    query rows that see no key (more queries than keys)."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    nheads = 2 * (heads_for_more_tiles_than_sms(1, seqlen_k // 128) // 2 + 1)  # even, for GQA
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, nheads, nheads // 2, head_dim, dtype, seed=seqlen_q + head_dim)
    dout = random_dout(q, seqlen_k + head_dim)
    poison_allocator()
    grads = flash_grads(q, k, v, dout, causal=True)
    assert_grads_within_rule(grads, q, k, v, dout, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_k", [2, 113, 1000])
def test_backward_single_query_causal_is_non_causal(dtype, head_dim, seqlen_k, request):
    """causal=True with one query row: the gradients of the non-causal reference."""
    skip_unbuilt(head_dim, dtype)
    if (dtype, head_dim, seqlen_k) == (torch.bfloat16, 128, 2):
        xfail_single_query_bf16_backward(request)
    q, k, v = random_qkv(3, 1, seqlen_k, 8, 2, head_dim, dtype, seed=seqlen_k)
    dout = random_dout(q, seqlen_k + 1)
    grads = flash_grads(q, k, v, dout, causal=True)
    assert_grads_within_rule(grads, q, k, v, dout, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("nheads_k", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_gqa_mqa(dtype, head_dim, nheads_k, causal):
    """dk, dv of a K/V head are the sums over the query heads that share it."""
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 300, 517, 8, nheads_k, head_dim, dtype, seed=nheads_k)
    dout = random_dout(q, 7)
    grads = flash_grads(q, k, v, dout, causal)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    assert_grads_within_rule(grads, q, k, v, dout, causal)


def test_backward_softmax_scale_and_non_contiguous_inputs():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    gen = torch.Generator(device="cuda").manual_seed(12)
    qkv = torch.randn(2, 333, 3, 4, head_dim, device="cuda", dtype=dtype, generator=gen)
    q, k, v = qkv.unbind(2)
    dout = random_dout(q, 13).transpose(1, 2).contiguous().transpose(1, 2)
    assert not (q.is_contiguous() or dout.is_contiguous())
    grads = flash_grads(q, k, v, dout, causal=True, softmax_scale=0.3)
    assert_grads_within_rule(grads, q, k, v, dout, causal=True, softmax_scale=0.3)


def test_backward_misaligned_inputs():
    """q, k, v and dout off 16-byte alignment (views at an odd storage offset) are copied, not read
    as they are."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    shape = (2, 100, 4, head_dim)
    gen = torch.Generator(device="cuda").manual_seed(15)
    leaves = [torch.randn(math.prod(shape) + 1, device="cuda", dtype=dtype, generator=gen).requires_grad_()
              for _ in range(4)]
    q, k, v, dout = (t[1:].view(shape) for t in leaves)
    assert all(t.data_ptr() % 16 != 0 for t in (q, k, v, dout))
    grads = torch.autograd.grad(flash_attn_func(q, k, v, causal=True), (q, k, v), dout.detach())
    assert_grads_within_rule(grads, q, k, v, dout.detach(), causal=True)


def test_backward_of_a_scalar_loss():
    """out.sum().backward() hands the kernel a dout of zero strides."""
    dtype, head_dim = torch.float16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 190, 190, 2, 2, head_dim, dtype, seed=14))
    flash_attn_func(q, k, v, causal=True).sum().backward()
    grads_ref, grads_pt = reference_grads(q, k, v, torch.ones_like(q), causal=True)
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads_ref, grads_pt):
        assert_within_rule(name, g, g_ref, g_pt)


def skip_on_hopper_family(kernel_family):
    """FLASH_ATTN_CUDA_SMEM_LIMIT stands for a GPU with less shared memory than sm90's, which runs the
    FA2 family only."""
    if kernel_family == "sm90":
        pytest.skip("a GPU with less shared memory than sm90 runs the FA2 family")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [160, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_on_the_tile_shapes_of_gpus_with_less_shared_memory(dtype, head_dim, causal, monkeypatch,
                                                                    kernel_family):
    """At these head dims the FA2 backward has a tile shape that needs more shared memory than an
    A100 (d=256) or an sm86 GPU (d=160) has; FLASH_ATTN_CUDA_SMEM_LIMIT makes the launcher take the
    shape those GPUs get."""
    skip_on_hopper_family(kernel_family)
    skip_unbuilt(head_dim, dtype)
    ext = _extension.load()
    base, large = ext.bwd_kernel_config(head_dim, False), ext.bwd_kernel_config(head_dim, True)
    assert base["smem_bytes"] < large["smem_bytes"]
    monkeypatch.setenv("FLASH_ATTN_CUDA_SMEM_LIMIT", str(large["smem_bytes"] - 1))
    q, k, v = random_qkv(2, 1000, 1100, 4, 2, head_dim, dtype, seed=head_dim + causal)
    dout = random_dout(q, 7)
    for deterministic in (False, True):
        grads = flash_grads(q, k, v, dout, causal, deterministic=deterministic)
        assert_grads_within_rule(grads, q, k, v, dout, causal)


def test_backward_raises_where_no_tile_shape_fits_the_shared_memory(monkeypatch, kernel_family):
    skip_on_hopper_family(kernel_family)
    dtype = torch.bfloat16
    skip_unbuilt(256, dtype)
    q, k, v = random_qkv(1, 128, 128, 2, 2, 256, dtype, seed=3)
    monkeypatch.setenv("FLASH_ATTN_CUDA_SMEM_LIMIT", str(99 * 1024))
    with pytest.raises(RuntimeError, match="KB of shared memory per block"):
        flash_grads(q, k, v, random_dout(q, 4), causal=False)
    monkeypatch.setenv("FLASH_ATTN_CUDA_SMEM_LIMIT", "lots")
    with pytest.raises(ValueError, match="FLASH_ATTN_CUDA_SMEM_LIMIT"):
        flash_grads(q, k, v, random_dout(q, 4), causal=False)


def assert_deterministic_grads(q, k, v, dout, causal, repeats):
    """deterministic=True: the gradients of repeats more runs bitwise equal to the first's, which
    are within the rule."""
    first = flash_grads(q, k, v, dout, causal, deterministic=True)
    for _ in range(repeats):
        again = flash_grads(q, k, v, dout, causal, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} changed between deterministic runs"
    assert_grads_within_rule(first, q, k, v, dout, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_deterministic_is_bitwise_reproducible(causal, head_dim):
    """Many KV blocks add into each dq block; deterministic=True fixes their order."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 1500, 2100, 4, 2, head_dim, dtype, seed=15)
    assert_deterministic_grads(q, k, v, random_dout(q, 16), causal, repeats=5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_deterministic_with_several_tiles_per_sm(causal, head_dim):
    """More than two (KV block, head) tiles per SM, so that the KV blocks that add into one dq block
    in turn run beside each other and after each other; GQA, and seqlen_q != seqlen_k so that the
    causal diagonal is shifted."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    nheads = 2 * (heads_for_more_tiles_than_sms(1, 1100 // 128) // 2 + 1)  # even, for GQA
    q, k, v = random_qkv(1, 900, 1100, nheads, nheads // 2, head_dim, dtype, seed=head_dim + causal)
    assert_deterministic_grads(q, k, v, random_dout(q, 19), causal, repeats=3)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_repeated_backward_has_no_moving_error(head_dim):
    """A race shows as an error that moves between runs of the same inputs. dk and dv are summed
    inside one thread block, so they must not move at all; dq may move by the rounding of its
    atomic adds only."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 1111, 1111, 4, 4, head_dim, dtype, seed=17)
    dout = random_dout(q, 18)
    grads_ref, grads_pt = reference_grads(q, k, v, dout, causal=True)
    first = flash_grads(q, k, v, dout, causal=True)
    for _ in range(20):
        grads = flash_grads(q, k, v, dout, causal=True)
        assert torch.equal(grads[1], first[1]) and torch.equal(grads[2], first[2])
        for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt):
            assert_within_rule(name, g, g_ref, g_pt)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_replayed_from_a_cuda_graph(causal):
    """The backward's kernels and memsets captured in a CUDA graph and replayed on new inputs give
    the eager gradients: dk and dv bitwise, dq within the rule."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    shape = (2, 700, 900, 4, 2, head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(*shape, seed=31))
    dout = random_dout(q, 32)

    def step():
        return torch.autograd.grad(flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    with torch.no_grad():
        for t, fresh in zip((q, k, v, dout), (*random_qkv(*shape, seed=33), random_dout(q, 34))):
            t.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    eager = flash_grads(q, k, v, dout, causal)
    assert torch.equal(grads[1], eager[1]) and torch.equal(grads[2], eager[2])
    grads_ref, grads_pt = reference_grads(q, k, v, dout, causal)
    assert_within_rule("dq", grads[0], grads_ref[0], grads_pt[0])


def test_empty_keys_give_zero_output_and_gradients():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 17, 0, 2, 2, head_dim, dtype, seed=19))
    out = flash_attn_func(q, k, v)
    assert torch.equal(out, torch.zeros_like(out))
    out.backward(random_dout(q, 20))
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_causal_rows_without_keys_get_zero_gradients():
    """seqlen_q > seqlen_k, causal: the first seqlen_q - seqlen_k queries see no key."""
    dtype, head_dim = torch.float16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 300, 100, 2, 2, head_dim, dtype, seed=21)
    dout = random_dout(q, 22)
    grads = flash_grads(q, k, v, dout, causal=True)
    assert torch.equal(grads[0][:, :200], torch.zeros_like(grads[0][:, :200]))
    assert_grads_within_rule(grads, q, k, v, dout, causal=True)


def test_saved_tensors_are_inputs_output_and_lse_only():
    """No seqlen^2 buffer is kept for the backward pass: q, k, v, out, lse and the (here empty, no
    dropout) rng_state."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(2, 300, 400, 4, 2, head_dim, dtype, seed=23))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_attn_func(q, k, v, causal=True)
    assert sorted(saved) == sorted([q.shape, k.shape, v.shape, q.shape, (2, 4, 300), (0,)])


def test_backward_memory_is_linear_in_seqlen():
    """Beyond the gradients, the backward allocates O(seqlen * d): the fp32 dq accumulator and D."""
    dtype, head_dim = torch.bfloat16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 8192, 8192, 16, 16, head_dim, dtype, seed=24))
    out = flash_attn_func(q, k, v)
    dout = random_dout(q, 25)
    _, extra = peak_extra_bytes(lambda: out.backward(dout))
    grads = 3 * q.numel() * q.element_size()
    scratch = q.numel() * 4 + 16 * 8192 * 4
    assert extra <= grads + scratch + 8 * 2**20, f"backward allocated {extra} bytes beyond {grads + scratch}"


def test_torch_compile_fullgraph_training_step():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 129, 129, 4, 2, head_dim, dtype, seed=26)

    def loss_fn(q, k, v):
        return flash_attn_func(q, k, v, causal=True, deterministic=True).float().square().sum()

    assert_compiled_grads_equal_eager(loss_fn, (q, k, v))
