"""The forward kernel against the float32 reference, under the numerics rule of DESIGN.md (GPU)."""

import math

import pytest
import torch

from conftest import (
    assert_lse_within,
    assert_within_rule,
    dtype_id,
    grads_of,
    lift_key_groups,
    peak_extra_bytes,
    poison_allocator,
    random_qkv,
    requires_gpu,
    skip_unbuilt,
)
from flash_attn_cuda import _extension, flash_attn_func
from flash_attn_cuda.reference import attention_ref

pytestmark = [pytest.mark.gpu, requires_gpu, pytest.mark.usefixtures("kernel_family")]

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [32, 40, 59, 64, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [(1, 1), (1, 113), (113, 1), (113, 203), (256, 256), (1000, 1000), (2049, 1000), (1000, 2049), (128, 2049)]


def assert_numerics_rule(out, q, k, v, causal, softmax_scale=None, window_size=(-1, -1)):
    out_ref, _ = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)
    out_pt, _ = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                              upcast=False)
    assert_within_rule("out", out, out_ref, out_pt)


def assert_lse_close(lse, q, k, causal, softmax_scale=None, window_size=(-1, -1)):
    _, lse_ref = attention_ref(q, k, k, causal=causal, softmax_scale=softmax_scale, window_size=window_size)
    assert_lse_within(lse, lse_ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
def test_forward_matches_reference(dtype, head_dim, causal, seqlen_q, seqlen_k):
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 4, head_dim, dtype, seed=seqlen_q * 7 + seqlen_k + head_dim)
    poison_allocator()
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert probs is None
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (2, 4, seqlen_q) and lse.dtype == torch.float32
    assert_numerics_rule(out, q, k, v, causal)
    assert_lse_close(lse, q, k, causal)


def test_long_causal_window_forward_matches_reference():
    """A causal sliding window from 2k query rows on, on the 192-row tiles at d=64: the tiles' key
    ranges start mid-sequence and hold masked blocks on both edges."""
    dtype, head_dim, window = torch.bfloat16, 64, (700, 0)
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 8250, 8250, 2, 1, head_dim, dtype, seed=8250)
    poison_allocator()
    out = flash_attn_func(q, k, v, causal=True, window_size=window)
    assert_numerics_rule(out, q, k, v, causal=True, window_size=window)


@pytest.mark.parametrize("seqlen_q", [576, 2100, 1000])
def test_non_causal_forward_on_either_tile_height_matches_reference(seqlen_q):
    """At d=64 the Hopper family's non-causal kernel takes 192-row tiles when there are enough of
    them (64 sequences here; csrc/sm90/fwd_tile_config.h): 576 rows fill them, 2100 and 1000 rows end
    inside the last one, 1000 rows with a warpgroup none of whose rows is in the sequence."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(4, seqlen_q, 700, 16, 4, head_dim, dtype, seed=seqlen_q)
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal=False)
    assert_lse_close(lse, q, k, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(2049, 2049), (2100, 3001), (8200, 8200), (8300, 9001), (9001, 8300)])
def test_long_causal_forward_matches_reference(dtype, seqlen_q, seqlen_k):
    """From 2k query rows on, causal problems at d=64 take the Hopper family's 192-row tiles however
    few (csrc/sm90/fwd_tile_config.h); lengths that are multiples of neither 192 nor 128, rows that see
    no key (seqlen_q > seqlen_k)."""
    head_dim = 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, seqlen_q, seqlen_k, 2, 2, head_dim, dtype, seed=seqlen_q + seqlen_k)
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal=True)
    assert_lse_close(lse, q, k, causal=True)


@pytest.mark.parametrize("causal,window_size", [(True, (-1, -1)), (True, (300, 0)), (False, (100, 50)),
                                                (False, (256, 256)), (False, (-1, 90)), (False, (400, -1))])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(2000, 2000), (1100, 1300), (576, 700)])
def test_tall_tiles_visit_each_warpgroups_own_blocks(causal, window_size, seqlen_q, seqlen_k):
    """On d=64's 192-row tiles (64 sequences: enough of them) each consumer warpgroup of the Hopper
    forward visits only the KV blocks its own 64 rows see and passes the tile's others
    (csrc/sm90/fwd_consumer.h): the causal diagonal and the windows give the three warpgroups
    different ranges, and the last tiles of 2000 and 1100 rows hold a warpgroup with few or no rows
    in the sequence."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(4, seqlen_q, seqlen_k, 16, 8, head_dim, dtype, seed=seqlen_q + sum(window_size))
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window_size, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal, window_size=window_size)
    assert_lse_close(lse, q, k, causal, window_size=window_size)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 256), (1, 257), (3, 384), (64, 1000), (17, 4096), (1, 8191)])
@pytest.mark.parametrize("causal,window_size", [(False, (-1, -1)), (True, (-1, -1)), (False, (200, 100)),
                                                (True, (50, 0)), (True, (700, 0))])
def test_decode_shaped_tiles_split_their_blocks(head_dim, seqlen_q, seqlen_k, causal, window_size):
    """Up to 64 query rows against four 64-key blocks or more: the Hopper forward's split-block kernels,
    both consumer warpgroups on the tile's rows, each over every other KV block, merged at the end
    (csrc/sm90/fwd_split_blocks.h). An even and an odd number of blocks, windows that leave the
    second warpgroup one block or none, GQA, more tiles than SMs at d=64 (8 x 24 heads)."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    batch, nheads = (8, 24) if head_dim == 64 else (2, 8)
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads // 4, head_dim, dtype,
                         seed=seqlen_q + seqlen_k + head_dim + window_size[0])
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window_size, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal, window_size=window_size)
    assert_lse_close(lse, q, k, causal, window_size=window_size)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1024, 1024), (700, 1024), (1025, 1025)])
@pytest.mark.parametrize("causal,window_size", [(True, (-1, -1)), (False, (-1, -1)), (False, (300, 40))])
def test_forward_with_more_tiles_than_sms(head_dim, seqlen_q, seqlen_k, causal, window_size):
    """Several tiles per block of the Hopper family's persistent grid, which the blocks take from a
    counter (csrc/sm90/tile_queue.h) where causal, on 192-row tiles at d=64; GQA, more keys than
    queries, lengths on and off the 128-row blocks; a window whose left edge makes the warpgroups of a
    tile pass different KV blocks (csrc/sm90/fwd_consumer.h)."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(8, seqlen_q, seqlen_k, 8, 4, head_dim, dtype,
                         seed=seqlen_q + seqlen_k + head_dim + window_size[0])
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window_size, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal, window_size=window_size)
    assert_lse_close(lse, q, k, causal, window_size=window_size)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("nheads_k", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(dtype, head_dim, nheads_k, causal):
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(3, 300, 517, 8, nheads_k, head_dim, dtype, seed=nheads_k)
    out = flash_attn_func(q, k, v, causal=causal)
    assert_numerics_rule(out, q, k, v, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_k", [2, 113, 1000])
def test_single_query_causal_is_non_causal(dtype, head_dim, seqlen_k):
    """One query row sees every key under the bottom-right-aligned causal mask (a decoding step):
    causal=True gives the non-causal reference, and bitwise the non-causal kernels' output."""
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(3, 1, seqlen_k, 8, 2, head_dim, dtype, seed=seqlen_k)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal=False)
    assert_lse_close(lse, q, k, causal=False)
    out_non_causal, lse_non_causal, _ = flash_attn_func(q, k, v, causal=False, return_attn_probs=True)
    assert torch.equal(out, out_non_causal) and torch.equal(lse, lse_non_causal)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_poisoned_output_is_fully_written(seed, head_dim):
    """The output is allocated in a block just freed full of NaN: an element the kernel does not
    write stays NaN."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 333, 333, 4, 2, head_dim, dtype, seed=seed)
    poisoned = torch.full_like(q, float("nan"))
    poisoned_ptr = poisoned.data_ptr()
    del poisoned
    out = flash_attn_func(q, k, v, causal=True)
    assert out.data_ptr() == poisoned_ptr, "the output did not reuse the poisoned block"
    assert_numerics_rule(out, q, k, v, causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous_inputs(causal):
    dtype, head_dim = torch.float16, 64
    skip_unbuilt(head_dim, dtype)
    gen = torch.Generator(device="cuda").manual_seed(5)
    # Slices of a packed qkv tensor, and a (batch, nheads, seqlen, d) tensor seen transposed.
    qkv = torch.randn(2, 257, 3, 4, head_dim, device="cuda", dtype=dtype, generator=gen)
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    v = torch.randn(2, 4, 257, head_dim, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out = flash_attn_func(q, k, v, causal=causal)
    assert_numerics_rule(out, q, k, v, causal)


def test_misaligned_inputs():
    """Data pointers off 16-byte alignment (a view at an odd storage offset) still work."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    shape = (2, 100, 4, head_dim)
    q, k, v = (torch.randn(math.prod(shape) + 1, device="cuda", dtype=dtype)[1:].view(shape) for _ in range(3))
    assert q.data_ptr() % 16 != 0
    out = flash_attn_func(q, k, v, causal=True)
    assert_numerics_rule(out, q, k, v, causal=True)


def test_softmax_scale():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 200, 300, 2, 2, head_dim, dtype, seed=9)
    out, lse, _ = flash_attn_func(q, k, v, softmax_scale=0.37, causal=True, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal=True, softmax_scale=0.37)
    assert_lse_close(lse, q, k, causal=True, softmax_scale=0.37)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("inf"), float("nan")])
def test_invalid_softmax_scale_raises(scale):
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 16, 16, 2, 2, head_dim, dtype, seed=0)
    with pytest.raises(ValueError, match="softmax_scale must be positive and finite"):
        flash_attn_func(q, k, v, softmax_scale=scale)


def test_integer_softmax_scale():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 77, 77, 2, 2, head_dim, dtype, seed=1)
    assert_numerics_rule(flash_attn_func(q, k, v, softmax_scale=1), q, k, v, causal=False, softmax_scale=1.0)


def test_large_inputs_do_not_overflow():
    """Scores of hundreds: the online softmax must subtract the running max before exp."""
    dtype, head_dim = torch.bfloat16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 512, 512, 2, 2, head_dim, dtype, seed=11)
    q, k = q * 8, k * 8
    out = flash_attn_func(q, k, v)
    assert_numerics_rule(out, q, k, v, causal=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("jump", [25, 150])
def test_running_max_jumps_between_kv_blocks(dtype, head_dim, causal, jump):
    """Each 64-key group of K lifts its scores by its own random offset of 0-jump (times a per-row
    factor in [0, 1]): from one KV block to the next a row's max rises by more or by less than the
    2^8 that the Hopper forward lets its running max lag before it rescales O (common/softmax.h),
    and rows of one warp disagree about it. At 150 (216 in log2 units) the exponentials at a lagging
    max overflow, which the Hopper forward's steps at the current max (d <= 192, fwd_consumer.h)
    must notice and redo."""
    skip_unbuilt(head_dim, dtype)
    seqlen_q, seqlen_k = 300, 1100
    q, k, v = random_qkv(2, seqlen_q, seqlen_k, 4, 4, head_dim, dtype, seed=head_dim + causal)
    lift_key_groups(q, k, jump, seed=head_dim + jump)
    poison_allocator()
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert_numerics_rule(out, q, k, v, causal)
    assert_lse_close(lse, q, k, causal)


def test_torch_compile_fullgraph():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 129, 129, 4, 4, head_dim, dtype, seed=3)

    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True) * 2

    compiled = torch.compile(attend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), rtol=0, atol=0)


def test_unbuilt_head_dim_names_the_knob():
    built = _extension.load().built_config()
    missing = [d for d in (32, 64, 96, 128, 160, 192, 224, 256) if d not in built["head_dims"]]
    if not missing:
        pytest.skip("every head dim is built")
    dtype = torch.bfloat16 if "bf16" in built["dtypes"] else torch.float16
    q, k, v = random_qkv(1, 16, 16, 1, 1, missing[0], dtype, seed=0)
    with pytest.raises(RuntimeError, match="FLASH_ATTN_HDIMS"):
        flash_attn_func(q, k, v)


def test_unbuilt_dtype_names_the_knob():
    built = _extension.load().built_config()
    missing = [name for name in ("fp16", "bf16") if name not in built["dtypes"]]
    if not missing:
        pytest.skip("both dtypes are built")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[missing[0]]
    q, k, v = random_qkv(1, 16, 16, 1, 1, built["head_dims"][0], dtype, seed=0)
    with pytest.raises(RuntimeError, match="FLASH_ATTN_DTYPES"):
        flash_attn_func(q, k, v)


def test_inputs_on_different_devices():
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 16, 16, 2, 2, head_dim, dtype, seed=0)
    with pytest.raises(ValueError, match="device of q"):
        flash_attn_func(q, k.cpu(), v)


def test_forward_memory_is_linear_in_seqlen():
    """Beyond its inputs, the forward allocates O and L only: no seqlen^2 buffer."""
    dtype, head_dim = torch.bfloat16, 128
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 8192, 8192, 16, 16, head_dim, dtype, seed=6)
    (out, lse, _), extra = peak_extra_bytes(lambda: flash_attn_func(q, k, v, return_attn_probs=True))
    outputs = out.numel() * out.element_size() + lse.numel() * lse.element_size()
    # The allocator rounds each block up to at most 2 MiB.
    assert extra <= outputs + 4 * 2**20, f"forward allocated {extra} bytes for {outputs} bytes of outputs"


@pytest.mark.parametrize("head_dim", [64, 96, 128, 160, 192, 256])
def test_the_family_that_serves_a_forward_is_reported(kernel_family, head_dim):
    """fwd_family says which family runs a forward: sm90 for the head dims it was built for (on an
    sm90 GPU, not forced off), sm80 for the others."""
    dtype = torch.bfloat16
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(1, 64, 64, 2, 2, head_dim, dtype, seed=head_dim)
    served = _extension.load().fwd_family(q, k, v, None, None, 0, 0, 0.125, False)
    sm90_dims = _extension.load().built_config()["family_head_dims"].get("sm90", [])
    assert served == ("sm90" if kernel_family == "sm90" and head_dim in sm90_dims else "sm80")


def test_non_contiguous_last_dimension_is_copied():
    """q, k, v whose last dimension is strided are copied, not rejected (as flash-attn does), and
    give bitwise the result of their contiguous copies, forward and backward."""
    dtype, head_dim = torch.bfloat16, 64
    skip_unbuilt(head_dim, dtype)
    q, k, v = random_qkv(2, 33, 65, 4, 2, head_dim, dtype, seed=8)
    strided = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v)]
    assert all(t.stride(-1) != 1 for t in strided)
    dout = torch.randn_like(q)
    out, grads = grads_of(lambda *t: flash_attn_func(*t, causal=True), strided, dout)
    out_ref, grads_ref = grads_of(lambda *t: flash_attn_func(*t, causal=True), (q, k, v), dout)
    assert torch.equal(out, out_ref)
    for g, g_ref in zip(grads, grads_ref):
        assert torch.equal(g, g_ref)
