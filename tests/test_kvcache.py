"""flash_attn_with_kvcache against a reference that builds each sequence's keys by hand: the
layout of the cache as a varlen batch (CPU, on a plain-torch stand-in for the forward), the kernels
under the numerics rule (GPU), the cache written in place, and the argument checks (CPU)."""

import pytest
import torch

from conftest import assert_lse_within, assert_within_rule, dtype_id, poison_allocator, requires_gpu, skip_unbuilt
from flash_attn_cuda import _extension, flash_attn_with_kvcache
from flash_attn_cuda import kvcache as kvcache_module
from flash_attn_cuda.kvcache_layout import SPLIT_ALIGN, merge_splits, sequence_offsets
from flash_attn_cuda.reference import attention_ref


def rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding written as complex multiplication (interleaved) or with rotate-half
    (GPT-NeoX), in float64: x (batch, seqlen, nheads, d), positions (batch, seqlen)."""
    half = cos.shape[1]
    angle_cos, angle_sin = cos.double()[positions][:, :, None], sin.double()[positions][:, :, None]
    head, tail = x[..., : 2 * half].double(), x[..., 2 * half :]
    if interleaved:
        pairs = torch.view_as_complex(head.reshape(*head.shape[:-1], half, 2).contiguous())
        turned = torch.view_as_real(pairs * torch.complex(angle_cos, angle_sin)).flatten(-2)
    else:
        cos_full, sin_full = torch.cat((angle_cos, angle_cos), -1), torch.cat((angle_sin, angle_sin), -1)
        rotate_half = torch.cat((-head[..., half:], head[..., :half]), -1)
        turned = head * cos_full + rotate_half * sin_full
    return torch.cat((turned.to(x.dtype), tail), -1)


def kvcache_reference(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                      cache_batch_idx=None, cache_leftpad=None, block_table=None, causal=False, window_size=(-1, -1),
                      softcap=0.0, alibi_slopes=None, rotary_interleaved=True, softmax_scale=None):
    """(out in float32, out of the standard implementation, lse, the caches after the append),
    sequence by sequence: the slot's rows (or its pages in order), the new rows written at
    cache_seqlens, the keys [leftpad, cache_seqlens + seqlen_new) given to attention_ref."""
    batch, seqlen_q = q.shape[:2]
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    page = k_cache.shape[1]
    capacity = block_table.shape[1] * page if block_table is not None else k_cache.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    outs, pts, lses = [], [], []
    for b in range(batch):
        length = capacity if cache_seqlens is None else int(cache_seqlens if isinstance(cache_seqlens, int)
                                                             else cache_seqlens[b])
        start = 0 if cache_leftpad is None else int(cache_leftpad[b])
        q_b = q[b : b + 1]
        if block_table is not None:
            rows = [(int(block_table[b, t // page]), t % page) for t in range(capacity)]
        else:
            slot = b if cache_batch_idx is None else int(cache_batch_idx[b])
            rows = [(slot, t) for t in range(capacity)]
        if k is not None:
            k_b = k[b : b + 1]
            if rotary_cos is not None:
                positions = torch.arange(length, length + seqlen_new, device=q.device)[None]
                k_b = rotate(k_b, rotary_cos, rotary_sin, positions, rotary_interleaved)
                per_row = causal or tuple(window_size) != (-1, -1)
                q_positions = (torch.arange(length, length + seqlen_q, device=q.device) if per_row
                               else torch.full((seqlen_q,), length, device=q.device))
                q_b = rotate(q_b, rotary_cos, rotary_sin, q_positions[None], rotary_interleaved)
            for t in range(seqlen_new):
                k_cache[rows[length + t]] = k_b[0, t]
                v_cache[rows[length + t]] = v[b, t]
        used = rows[start : length + seqlen_new]
        keys = torch.stack([k_cache[r] for r in used])[None] if used else k_cache[:1, :0]
        values = torch.stack([v_cache[r] for r in used])[None] if used else v_cache[:1, :0]
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b : b + 1]
        variant = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=slopes,
                       softmax_scale=softmax_scale, window_seqlen_k=capacity, compute_dtype=compute_dtype_of(q))
        out, lse = attention_ref(q_b, keys, values, **variant)
        pt, _ = attention_ref(q_b, keys, values, upcast=False, **variant)
        outs.append(out)
        pts.append(pt)
        lses.append(lse)
    return torch.cat(outs), torch.cat(pts), torch.cat(lses), k_cache, v_cache


def compute_dtype_of(q):
    """The reference's float32, or float64 for the CPU layout test's float64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def varlen_stand_in(*, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_size, softcap, alibi_slopes, **unused):
    """The varlen forward of the op in plain torch (attention_ref per sequence, the window
    normalized by max_seqlen_k, sequences clamped to it as the kernels do): (out, lse, None)."""
    nheads = q.shape[1]
    out = torch.full_like(q, float("nan"))
    lse = torch.full((nheads, q.shape[0]), float("nan"), dtype=torch.float32)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        q0, q1, k0 = cu_q[s], cu_q[s + 1], cu_k[s]
        k1 = min(cu_k[s + 1], k0 + max_seqlen_k)
        if q1 == q0:
            continue
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[s : s + 1]
        o, l = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window_size=window_size,
                             softcap=softcap, alibi_slopes=slopes, softmax_scale=softmax_scale,
                             window_seqlen_k=max_seqlen_k, compute_dtype=compute_dtype_of(q))
        out[q0:q1], lse[:, q0:q1] = o[0], l[0]
    return out, lse, None


def random_case(device, dtype, batch=3, seqlen_q=4, nheads=4, nheads_k=2, head_dim=32, capacity=300, seqlen_new=3,
                slots=None, page=None, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    q = randn(batch, seqlen_q, nheads, head_dim)
    if page is None:
        shape = ((slots or batch), capacity, nheads_k, head_dim)
    else:
        shape = (batch * (capacity // page + 1) + 2, page, nheads_k, head_dim)
    k_cache, v_cache = randn(*shape), randn(*shape)
    k = randn(batch, seqlen_new, nheads_k, head_dim) if seqlen_new else None
    v = randn(batch, seqlen_new, nheads_k, head_dim) if seqlen_new else None
    return q, k_cache, v_cache, k, v


def lengths(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def rotary_tables(seqlen_ro, rotary_dim, device, dtype):
    angles = torch.arange(seqlen_ro, device=device)[:, None] * 0.37 ** torch.arange(rotary_dim // 2, device=device)
    return angles.cos().to(dtype), angles.sin().to(dtype)


# Each case: the keyword arguments beyond q, the caches, k and v (built per device by make_case).
CASES = {
    "lengths": dict(cache_seqlens=[0, 37, 290]),
    "int_length": dict(cache_seqlens=100),
    "leftpad": dict(cache_seqlens=[5, 200, 297], cache_leftpad=[5, 17, 1]),
    "batch_idx": dict(cache_seqlens=[50, 0, 129], cache_batch_idx=[3, 0, 2], slots=5),
    "batch_idx_repeated_read_only": dict(cache_seqlens=[60, 60, 7], cache_batch_idx=[1, 1, 0], slots=2,
                                          seqlen_new=0),
    "paged": dict(cache_seqlens=[0, 131, 250], page=64),
    "paged_leftpad": dict(cache_seqlens=[40, 131, 250], cache_leftpad=[32, 0, 200], page=16),
    "causal": dict(cache_seqlens=[0, 77, 290], causal=True),
    "causal_more_rows_than_keys": dict(cache_seqlens=[0, 2, 5], causal=True, seqlen_q=9),
    "window": dict(cache_seqlens=[20, 150, 290], window_size=(40, 0)),
    "window_both_sides": dict(cache_seqlens=[20, 150, 290], window_size=(7, 3), seqlen_q=6),
    "softcap": dict(cache_seqlens=[3, 99, 180], softcap=5.0),
    "alibi_per_batch": dict(cache_seqlens=[3, 99, 180], alibi=(3, 4), causal=True, cache_batch_idx=[2, 0, 1]),
    "alibi_per_head": dict(cache_seqlens=[3, 99, 180], alibi=(4,)),
    "rotary_interleaved_causal": dict(cache_seqlens=[0, 40, 200], rotary=16, causal=True),
    "rotary_neox": dict(cache_seqlens=[0, 40, 200], rotary=32, rotary_interleaved=False),
    "rotary_windowed_leftpad": dict(cache_seqlens=[9, 40, 200], cache_leftpad=[2, 0, 33], rotary=8,
                                    window_size=(50, -1)),
    "decode_gqa": dict(cache_seqlens=[1, 260, 297], seqlen_q=1, nheads=8, nheads_k=2, causal=True),
    "decode_gqa_rotary_paged": dict(cache_seqlens=[1, 170, 255], seqlen_q=1, nheads=8, nheads_k=2, rotary=16,
                                    page=64),
    "decode_split": dict(cache_seqlens=[1, 270, 297], seqlen_q=1, num_splits=3),
    "decode_alibi_split": dict(cache_seqlens=[1, 270, 297], seqlen_q=1, alibi=(4,), num_splits=3),
    "decode_alibi_per_batch_split": dict(cache_seqlens=[0, 270, 297], seqlen_q=1, nheads_k=2, alibi=(3, 4),
                                         num_splits=4, cache_batch_idx=[2, 0, 1], cache_leftpad=[0, 3, 130]),
    "decode_alibi_strided_split": dict(cache_seqlens=[5, 270, 297], seqlen_q=1, alibi=(3, 8, "strided"),
                                       num_splits=3),
    "decode_window_gqa": dict(cache_seqlens=[20, 150, 290], seqlen_q=1, nheads=8, nheads_k=2, window_size=(40, 0)),
    "decode_window_split_leftpad": dict(cache_seqlens=[5, 200, 297], cache_leftpad=[5, 17, 1], seqlen_q=1,
                                        window_size=(150, -1), num_splits=3),
    "decode_window_alibi_split": dict(cache_seqlens=[3, 99, 180], seqlen_q=1, alibi=(4,), window_size=(60, 2),
                                      num_splits=2),
    "decode_window_rotary_paged": dict(cache_seqlens=[1, 170, 255], seqlen_q=1, nheads=8, nheads_k=2, rotary=16,
                                       page=64, window_size=(100, 0)),
    # Pages of multiples of 128 rows are read in place (paged_keys.h), the others gathered.
    "paged_in_place": dict(cache_seqlens=[0, 131, 250], page=128),
    "paged_in_place_causal_window": dict(cache_seqlens=[10, 131, 250], page=256, causal=True, window_size=(50, 0)),
    "paged_in_place_whole_pages": dict(cache_seqlens=[0, 128, 384], page=128, seqlen_new=0),
    "decode_paged_split": dict(cache_seqlens=[1, 200, 370], seqlen_q=1, nheads=8, nheads_k=2, page=128,
                               num_splits=3),
    "decode_paged_page_edges": dict(cache_seqlens=[253, 0, 125], seqlen_q=1, page=256, num_splits=2),
    "decode_paged_alibi_rotary": dict(cache_seqlens=[1, 170, 255], seqlen_q=1, rotary=16, alibi=(4,), page=128),
    "decode_window_paged_gathered": dict(cache_seqlens=[1, 170, 255], seqlen_q=1, nheads=8, nheads_k=2, page=128,
                                         window_size=(100, 0)),
    "split_rows": dict(cache_seqlens=[0, 270, 297], seqlen_q=5, num_splits=4, nheads_k=4),
    "split_sequence_without_keys": dict(cache_seqlens=[0, 200, 290], seqlen_new=0, seqlen_q=1, num_splits=2),
    "no_new_keys": dict(cache_seqlens=[10, 0, 300], seqlen_new=0),
    "whole_cache": dict(seqlen_new=0),
}


def make_case(name, device, dtype, seed=0, head_dim=32):
    """(q, k_cache, v_cache, k, v, the other arguments) of flash_attn_with_kvcache for the case."""
    case = dict(CASES[name], head_dim=head_dim)
    shape_keys = ("batch", "seqlen_q", "nheads", "nheads_k", "head_dim", "capacity", "seqlen_new", "slots", "page")
    shape = {key: case.pop(key) for key in shape_keys if key in case}
    q, k_cache, v_cache, k, v = random_case(device, dtype, seed=seed, **shape)
    kwargs = {}
    for key in ("cache_seqlens", "cache_leftpad", "cache_batch_idx"):
        if key in case:
            value = case.pop(key)
            kwargs[key] = value if isinstance(value, int) else lengths(value, device)
    if "page" in shape:
        page, batch = shape["page"], q.shape[0]
        blocks = 300 // page + 1
        perm = torch.randperm(k_cache.shape[0], generator=torch.Generator().manual_seed(seed))[: batch * blocks]
        kwargs["block_table"] = perm.reshape(batch, blocks).to(torch.int32).to(device)
    if "rotary" in case:
        capacity = kwargs["block_table"].shape[1] * shape["page"] if "page" in shape else k_cache.shape[1]
        kwargs["rotary_cos"], kwargs["rotary_sin"] = rotary_tables(capacity + 5, case.pop("rotary"), device, dtype)
    if "alibi" in case:
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        alibi = case.pop("alibi")
        strided = alibi[-1] == "strided"
        slopes = torch.rand(*(alibi[:-1] if strided else alibi), generator=gen, device=device)
        # "strided": (batch, nheads) slopes as a view of every other column of a wider tensor.
        kwargs["alibi_slopes"] = slopes[:, ::2] if strided else slopes
    kwargs.update(case)
    return q, k_cache, v_cache, k, v, kwargs


def unchecked(checked_values):
    """_checked_values returning what it returns under CUDA graph capture (no values, slots that
    may repeat), after its checks."""
    def facts_of_capture(*args):
        checked_values(*args)
        return {"distinct_slots": False, "longest": None, "end": None}
    return facts_of_capture


def run_case(q, k_cache, v_cache, k, v, kwargs):
    """flash_attn_with_kvcache on copies of the caches, and the reference: (out, lse, caches, reference)."""
    k_ours, v_ours = k_cache.clone(), v_cache.clone()
    out, lse = flash_attn_with_kvcache(q, k_ours, v_ours, k, v, return_softmax_lse=True, **kwargs)
    reference_kwargs = {key: value for key, value in kwargs.items() if key != "num_splits"}
    reference = kvcache_reference(q, k_cache, v_cache, k, v, **reference_kwargs)
    return out, lse, (k_ours, v_ours), reference


@pytest.mark.parametrize("layout", ["host", "device"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cache_layout_matches_reference_on_cpu(name, layout, monkeypatch):
    """The cache as a varlen batch (gap sequences, sorted slots, pages, the decode GQA rows,
    split-KV and its merge, rotary, the append), with the forward replaced by plain torch; the
    offsets built on the host from the checked values, or on the device from the tensors (as
    under CUDA graph capture, where nothing is read back)."""
    monkeypatch.setattr(kvcache_module, "_attention", varlen_stand_in)
    if layout == "device":
        monkeypatch.setattr(kvcache_module, "_checked_values", unchecked(kvcache_module._checked_values))
    q, k_cache, v_cache, k, v, kwargs = make_case(name, "cpu", torch.float64)
    out, lse, (k_ours, v_ours), (out_ref, _, lse_ref, k_ref, v_ref) = run_case(q, k_cache, v_cache, k, v, kwargs)
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    # float64 throughout, but the chunks' lse are float32 (as the op's), which weight split-KV's merge.
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-6)
    assert torch.equal(lse.isfinite(), lse_ref.isfinite())
    torch.testing.assert_close(lse[lse.isfinite()], lse_ref[lse_ref.isfinite()], rtol=0, atol=1e-6)
    torch.testing.assert_close(k_ours, k_ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(v_ours, v_ref)


def test_one_row_caches_with_a_row_stride_are_copied(monkeypatch):
    """Caches of capacity 1 whose row stride is not the slot's (contiguous() keeps such a tensor as
    it is) are copied to the standard strides before they are read as rows."""
    monkeypatch.setattr(kvcache_module, "_attention", varlen_stand_in)
    q, k_cache, v_cache, _, _ = random_case("cpu", torch.float64, capacity=1, seqlen_new=0)
    # Slots 64 elements apart, a row stride of 48 that does not divide it.
    k_odd, v_odd = (torch.cat((c.flatten(), c.new_zeros(64))).as_strided(c.shape, (64, 48, 32, 1))
                    for c in (k_cache, v_cache))
    assert k_odd.is_contiguous()
    out, _, _, (out_ref, _, _, _, _) = run_case(q, k_odd, v_odd, None, None, dict(cache_seqlens=1))
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-6)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("layout", ["host", "device"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kvcache_matches_reference(name, dtype, head_dim, layout, monkeypatch):
    """Every case on the GPU, the offsets built on the host from the checked values or by the
    layout kernel (which also packs the chunks' query rows), as under CUDA graph capture."""
    skip_unbuilt(head_dim, dtype)
    if layout == "device":
        monkeypatch.setattr(kvcache_module, "_checked_values", unchecked(kvcache_module._checked_values))
    q, k_cache, v_cache, k, v, kwargs = make_case(name, "cuda", dtype, seed=head_dim, head_dim=head_dim)
    poison_allocator()
    out, lse, (k_ours, v_ours), (out_ref, out_pt, lse_ref, k_ref, v_ref) = run_case(q, k_cache, v_cache, k, v,
                                                                                    kwargs)
    assert out.dtype == dtype
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)
    # The rotation rounds once to the dtype in both (float32 against float64 before rounding).
    torch.testing.assert_close(k_ours, k_ref, rtol=1e-2, atol=1e-2)
    assert torch.equal(v_ours, v_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("layout", ["host", "device"])
@pytest.mark.parametrize("name", ["batch_idx", "decode_alibi_per_batch_split", "decode_gqa", "decode_split", "lengths",
                                  "split_rows", "decode_paged_split", "paged_in_place"])
def test_chunks_op_is_its_torch_composition(name, layout, monkeypatch):
    """The op kvcache_attention against _chunks_attention_torch, the torch calls it replaces (the
    same forward and merge kernels, so bitwise), and torch.library.opcheck against its fake."""
    skip_unbuilt(128, torch.bfloat16)
    if layout == "device":
        monkeypatch.setattr(kvcache_module, "_checked_values", unchecked(kvcache_module._checked_values))
    calls = []
    chunks_attention = kvcache_module._chunks_attention

    def spy(*args):
        calls.append(args)
        return chunks_attention(*args)

    monkeypatch.setattr(kvcache_module, "_chunks_attention", spy)
    q, k_cache, v_cache, k, v, kwargs = make_case(name, "cuda", torch.bfloat16, head_dim=128)
    flash_attn_with_kvcache(q, k_cache, v_cache, k, v, return_softmax_lse=True, **kwargs)
    (q_rows, chunks, options, _), = calls
    for return_lse in (True, False):
        out, lse = chunks_attention(q_rows, chunks, options, return_lse)
        out_torch, lse_torch = kvcache_module._chunks_attention_torch(q_rows, chunks, options, return_lse)
        assert torch.equal(out, out_torch) and out.is_contiguous()
        if return_lse:
            assert torch.equal(lse, lse_torch)
    window = options["window_size"]
    torch.library.opcheck(torch.ops.flash_attn_cuda.kvcache_attention.default,
                          (q_rows, chunks["packed_q"], chunks["k_cache"], chunks["v_cache"], chunks["block_table"],
                           chunks["per_slot"],
                           chunks["cu_q"], chunks["cu_k"], chunks["order"], chunks["inverse"], chunks["merge_slopes"],
                           chunks["splits"], chunks["grouped"], True, options["max_seqlen_q"], options["max_seqlen_k"],
                           128 ** -0.5, options["causal"], window[0], window[1], float(options["softcap"]),
                           options["alibi_slopes"], False, 0.0, False))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("num_splits", [0, 1, 5])
def test_long_decode_split_kv_matches_reference(num_splits):
    """One decode step over 8k-token caches of a batch too small to fill the GPU (split-KV by
    default), GQA, bf16 at d=128."""
    skip_unbuilt(128, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(num_splits)
    batch, capacity = 2, 8192
    q = torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache = (torch.randn(batch, capacity, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                        for _ in range(2))
    k, v = (torch.randn(batch, 1, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    kwargs = dict(cache_seqlens=lengths([8000, 3001], "cuda"), num_splits=num_splits)
    out, lse, _, (out_ref, out_pt, lse_ref, _, _) = run_case(q, k_cache, v_cache, k, v, kwargs)
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("page", [128, 256, 64])
def test_paged_cache_is_read_in_place(kernel_family, page):
    """A paged decode step over 4k-token caches (GQA, split-KV, pages shuffled): the Hopper family
    reads pages of multiples of 128 rows through the block table, with no gather of the pages
    (no indexing or gather kernel in the profile); the FA2 family, and pages of 64 rows, get them
    gathered.
    Both within the rule."""
    skip_unbuilt(128, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(page)
    batch, blocks = 3, 4096 // page
    q = torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache = (torch.randn(batch * blocks + 5, page, 2, 128, device="cuda", dtype=torch.bfloat16,
                                    generator=gen) for _ in range(2))
    table = torch.randperm(batch * blocks + 5, device="cuda", generator=gen)[: batch * blocks]
    kwargs = dict(cache_seqlens=lengths([4095, 2049, 1000], "cuda"), block_table=table.view(batch, blocks).int())
    poison_allocator()
    out, lse, _, (out_ref, out_pt, lse_ref, _, _) = run_case(q, k_cache, v_cache, None, None, kwargs)
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        again = flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
        torch.cuda.synchronize()
    assert torch.equal(again, out)
    names = [event.key for event in profile.key_averages()]
    in_place = kernel_family == "sm90" and page % 128 == 0
    assert any("flash_fwd" in name for name in names)
    assert any("index" in name.lower() or "gather" in name.lower() for name in names) != in_place, names


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("page", [None, 128, 256])
@pytest.mark.parametrize("num_splits", [1, 0])
@pytest.mark.parametrize("seqlen_q", [1, 100])
def test_cache_rows_past_the_keys_never_reach_the_output(kernel_family, page, num_splits, seqlen_q):
    """NaN and inf in every cache row past cache_seqlens (and in the pages no sequence uses) leave a
    step's output and lse bitwise as they are with zeros there, and finite: the KV block that ends a
    sequence's keys covers such rows, and only zeros in V's copy of them keep 0 * NaN out of O += P V.
    One query row: the Hopper family's split-block kernels zero those rows in shared memory, and the
    step builds no per-sequence TMA descriptors (no kernel of its own in the profile); 100 causal
    rows: its other kernels, which load V through such descriptors."""
    skip_unbuilt(128, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(3 if page is None else page)
    batch, capacity, seqlens = 4, 2304, [1000, 333, 2049, 100]
    q = torch.randn(batch, seqlen_q, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    dense_k, dense_v = (torch.randn(batch, capacity, 2, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                        for _ in range(2))
    kwargs = dict(cache_seqlens=lengths(seqlens, "cuda"), num_splits=num_splits, causal=seqlen_q > 1)
    if page is not None:
        blocks = capacity // page
        table = torch.randperm(batch * blocks + 2, device="cuda", generator=gen)[: batch * blocks]
        kwargs["block_table"] = table.view(batch, blocks).int()

    def cache(dense, past_keys):
        """The cache of these rows, `past_keys` (each sequence's by turns) in the rows past its keys."""
        dense = dense.clone()
        for b, n in enumerate(seqlens):
            dense[b, n:] = past_keys[b % len(past_keys)]
        if page is None:
            return dense
        pages = torch.full((batch * blocks + 2, page, 2, 128), past_keys[0], device="cuda", dtype=dense.dtype)
        pages[kwargs["block_table"].view(-1).long()] = dense.view(batch * blocks, page, 2, 128)
        return pages

    def step(past_keys):
        k_cache, v_cache = cache(dense_k, past_keys), cache(dense_v, past_keys)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **kwargs)
            torch.cuda.synchronize()
        return out, lse, [event.key for event in profile.key_averages()]

    out, lse, _ = step([0.0])
    dirty_out, dirty_lse, names = step([float("nan"), float("inf"), float("-inf")])
    assert torch.isfinite(dirty_out).all() and torch.isfinite(dirty_lse).all()
    assert torch.equal(dirty_out, out) and torch.equal(dirty_lse, lse)
    assert any("flash_fwd" in name for name in names)
    if kernel_family == "sm90":
        assert any("sequence_tensor_maps" in name for name in names) == (seqlen_q > 1), names


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("blocks", [1, 3])
def test_column_major_block_table(blocks):
    """A block table laid out by columns (a transposed tensor): read entry by entry as it is. With
    one column its row stride is not 1, which torch calls contiguous (a review found the op
    rejecting it)."""
    skip_unbuilt(128, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(blocks)
    batch, page = 4, 256
    q = torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache = (torch.randn(batch * blocks + 1, page, 2, 128, device="cuda", dtype=torch.bfloat16,
                                    generator=gen) for _ in range(2))
    table = torch.randperm(batch * blocks + 1, device="cuda", generator=gen)[: batch * blocks].int()
    table = table.view(blocks, batch).T
    assert table.stride(1) != 1
    kwargs = dict(cache_seqlens=lengths([100, 1, page * blocks - 3, page], "cuda")[:batch], block_table=table)
    out, lse, _, (out_ref, out_pt, lse_ref, _, _) = run_case(q, k_cache, v_cache, None, None, kwargs)
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("nheads_k", [8, 2])
def test_split_chunks_reach_the_family_of_their_problem(kernel_family, batch, nheads_k):
    """Every chunk of split-KV sees its batch's query rows. One decoding row per head (no GQA
    grouping) of a batch of one stayed a broadcast view (row stride 0), which the Hopper family
    cannot load through TMA, and such forwards fell back to the FA2 family; the forward the chunks
    get must run on the family that serves a problem of that shape (the kernels' names, from the
    profiler, say which ran)."""
    skip_unbuilt(128, torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(batch * nheads_k)
    q = torch.randn(batch, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_cache, v_cache = (torch.randn(batch, 2048, nheads_k, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                        for _ in range(2))
    kwargs = dict(cache_seqlens=lengths([2000, 1500, 700][:batch], "cuda"), num_splits=4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        out, lse, _, (out_ref, out_pt, lse_ref, _, _) = run_case(q, k_cache, v_cache, None, None, kwargs)
        torch.cuda.synchronize()
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)
    forwards = [event.key for event in profile.key_averages() if "flash_fwd" in event.key]
    sm90_dims = _extension.load().built_config()["family_head_dims"].get("sm90", [])
    expected = "sm90" if kernel_family == "sm90" and 128 in sm90_dims else "sm80"
    assert forwards and {"sm90" if "sm90" in name else "sm80" for name in forwards} == {expected}


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("heads_outer", [False, True])
@pytest.mark.parametrize("head_dim", [40, 100, 256])
@pytest.mark.parametrize("splits", [11, 20])
def test_merge_kernel_matches_torch_and_its_fake(heads_outer, head_dim, splits):
    """Split-KV's merge kernel against the torch merge (chunks without keys among them; more
    chunks than the kernel loads at once), its layout (heads_outer: the transpose of the merged
    rows and heads is contiguous), and torch.library.opcheck of the op against its fake."""
    gen = torch.Generator(device="cuda").manual_seed(head_dim + splits)
    batch, rows, nheads = 2, 3, 5
    out = torch.randn(batch * splits * rows, nheads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    lse = torch.randn(nheads, batch * splits * rows, device="cuda", generator=gen)
    lse[:, rows : 3 * rows] = float("inf")
    merged, merged_lse = merge_splits(out, lse, batch, splits, heads_outer=heads_outer)
    expected, expected_lse = merge_splits(out.cpu().double(), lse.cpu().double(), batch, splits)
    assert merged.shape == (batch, rows, nheads, head_dim)
    assert merged.transpose(1, 2).is_contiguous() == heads_outer
    torch.testing.assert_close(merged.cpu().double(), expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(merged_lse.cpu().double(), expected_lse, rtol=1e-6, atol=1e-5)
    torch.library.opcheck(torch.ops.flash_attn_cuda.kvcache_merge.default,
                          (out, lse, batch, splits, heads_outer, None, None))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("per_batch", [False, True])
def test_merge_kernel_shifts_alibi_chunks(per_batch):
    """With ALiBi the merge shifts each chunk's lse by -slope * (the batch's keys after the chunk),
    read from the layout's cu_seqlens_k: the kernel against the torch merge, and the op's fake."""
    gen = torch.Generator().manual_seed(int(per_batch))
    batch, splits, rows, nheads, head_dim = 3, 5, 1, 4, 64
    key_lengths = torch.tensor([1, 700, 1300])
    _, cu_k = sequence_offsets(torch.tensor([0, 2000, 4000]), key_lengths, rows, splits, 6000)
    out = torch.randn(batch * splits * rows, nheads, head_dim, generator=gen).to(torch.bfloat16)
    lse = torch.randn(nheads, batch * splits * rows, generator=gen)
    chunk_keys = cu_k[1:-1].reshape(batch, splits + 1).diff(dim=1)  # (batch, splits)
    lse[:, (chunk_keys.flatten() == 0).repeat_interleave(rows)] = float("inf")
    slopes = torch.rand((batch, nheads) if per_batch else (nheads,), generator=gen)
    merged, merged_lse = merge_splits(out.cuda(), lse.cuda(), batch, splits, alibi=(slopes.cuda(), cu_k.cuda()))
    expected, expected_lse = merge_splits(out.double(), lse.double(), batch, splits, alibi=(slopes.double(), cu_k))
    torch.testing.assert_close(merged.cpu().double(), expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(merged_lse.cpu().double(), expected_lse, rtol=1e-6, atol=1e-4)
    torch.library.opcheck(torch.ops.flash_attn_cuda.kvcache_merge.default,
                          (out.cuda(), lse.cuda(), batch, splits, False, slopes.cuda(), cu_k.cuda()))


@pytest.mark.gpu
@requires_gpu
def test_unsplit_merge_is_an_exact_copy():
    """With one chunk the merge puts a KV head's query heads back in their order: every weight 1,
    so out and lse come back bitwise (rows without keys: out 0, lse +inf, as the forward gives)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    batch, rows, nheads, head_dim = 3, 4, 2, 128
    out = torch.randn(batch * rows, nheads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    lse = torch.randn(nheads, batch * rows, device="cuda", generator=gen)
    lse[:, 5] = float("inf")
    out[5] = 0
    merged, merged_lse = merge_splits(out, lse, batch, 1, heads_outer=True)
    assert torch.equal(merged, out.reshape(batch, rows, nheads, head_dim))
    assert torch.equal(merged_lse, lse)


@pytest.mark.gpu
@requires_gpu
def test_decode_under_cuda_graph_replay():
    """Captured once, replayed after the lengths move on: the cache grows by the new row each time
    and the output follows the new lengths (no host check runs under capture)."""
    skip_unbuilt(64, torch.bfloat16)
    q, k_cache, v_cache, k, v = random_case("cuda", torch.bfloat16, seqlen_q=1, head_dim=64, seqlen_new=1)
    seqlens = lengths([3, 100, 250], "cuda")
    start_cache = (k_cache.clone(), v_cache.clone())
    flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=seqlens)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)
    k_cache.copy_(start_cache[0])
    v_cache.copy_(start_cache[1])
    for step in range(3):
        before = (k_cache.clone(), v_cache.clone())
        graph.replay()
        out_ref, out_pt, _, k_ref, _ = kvcache_reference(q, *before, k, v, cache_seqlens=seqlens)
        assert_within_rule("out", out, out_ref, out_pt)
        assert torch.equal(k_cache, k_ref)
        seqlens += 1


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("batch,valid", [(1, True), (3, True), (37, True), (1500, False)])
def test_layout_kernel_matches_torch(batch, valid, splits):
    """The offsets of csrc/kvcache's layout kernel (under CUDA graph capture) against the same steps
    in torch: left padding; 1500 batches (more than a block's threads, several chunks of its
    running max), with lengths and padding out of range (clamped); and the chunks' query rows it
    copies, from a strided view of q (a KV head's group of query heads, as decoding with GQA
    passes them), against torch's copy, and the op against its fake."""
    gen = torch.Generator().manual_seed(batch + splits)
    capacity, seqlen_new, rows_per_slot, rows = 700, 2, 800, 5
    top = capacity - seqlen_new + (0 if valid else 60)
    seqlens = torch.randint(0, top + 1, (batch,), generator=gen, dtype=torch.int32)
    leftpad = (torch.rand(batch, generator=gen) * (seqlens + 1)).to(torch.int32) - (0 if valid else 5)
    sizes = (capacity, batch, seqlen_new, rows_per_slot, rows, splits, (batch - 1) * rows_per_slot + capacity)
    q_rows = torch.randn(batch, 3, rows, 40, generator=gen).to(torch.bfloat16).transpose(1, 2)
    expected = kvcache_module._device_layout(seqlens, leftpad, *sizes, torch.device("cpu"))
    got = kvcache_module._device_layout(seqlens.cuda(), leftpad.cuda(), *sizes, torch.device("cuda"), q_rows.cuda())
    for name, e, g in zip(("cu_seqlens_q", "cu_seqlens_k"), expected, got):
        assert torch.equal(g.cpu().long(), e.long()), name
    packed = q_rows[:, None].expand(-1, splits, -1, -1, -1).reshape(batch * splits * rows, 3, 40)
    assert torch.equal(got[2].cpu(), packed)
    args = (torch.empty(0, device="cuda"), seqlens.cuda(), 0, leftpad.cuda(), batch, seqlen_new, capacity,
            rows_per_slot, rows, splits, SPLIT_ALIGN, sizes[-1], -1, q_rows.cuda())
    torch.library.opcheck(torch.ops.flash_attn_cuda.kvcache_layout.default, args)


@pytest.mark.gpu
@requires_gpu
def test_odd_head_dim_appends_and_rotates():
    """An odd head dim (the append kernel takes features in pairs; torch does it there)."""
    skip_unbuilt(64, torch.bfloat16)
    q, k_cache, v_cache, k, v, kwargs = make_case("rotary_neox", "cuda", torch.bfloat16, head_dim=59)
    out, lse, (k_ours, v_ours), (out_ref, out_pt, lse_ref, k_ref, v_ref) = run_case(q, k_cache, v_cache, k, v, kwargs)
    assert_within_rule("out", out, out_ref, out_pt)
    assert_lse_within(lse, lse_ref)
    torch.testing.assert_close(k_ours, k_ref, rtol=1e-2, atol=1e-2)
    assert torch.equal(v_ours, v_ref)


def test_empty_batch():
    q, k_cache, v_cache, _, _ = random_case("cpu", torch.float32, batch=0)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (0, 4, 4)


def cpu_case(**overrides):
    q, k_cache, v_cache, k, v = random_case("cpu", torch.float32)
    args = dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=lengths([1, 2, 3], "cpu"))
    args.update(overrides)
    return args


@pytest.mark.parametrize("overrides,match", [
    (dict(k_cache=torch.zeros(3, 300, 2)), "k_cache must be a 4-D tensor"),
    (dict(v_cache=torch.zeros(3, 200, 2, 32)), "one shape"),
    (dict(k_cache=torch.zeros(3, 300, 3, 32), v_cache=torch.zeros(3, 300, 3, 32)), "multiple of"),
    (dict(k_cache=torch.zeros(3, 300, 2, 16), v_cache=torch.zeros(3, 300, 2, 16)), "head dim"),
    (dict(k_cache=torch.zeros(3, 300, 2, 32, dtype=torch.float64),
          v_cache=torch.zeros(3, 300, 2, 32, dtype=torch.float64)), "dtype"),
    (dict(v=None), "k and v go together"),
    (dict(k=torch.zeros(3, 2, 2, 32)), "seqlen_new"),
    (dict(cache_seqlens=None), "need cache_seqlens"),
    (dict(cache_seqlens=298), "capacity"),
    (dict(cache_seqlens=torch.tensor([1, 2, 3])), "int32"),
    (dict(cache_seqlens=lengths([1, 2], "cpu")), "shape"),
    (dict(cache_seqlens=lengths([1, 298, 3], "cpu")), r"cache_seqlens\[1\]"),
    (dict(cache_seqlens=lengths([1, -1, 3], "cpu")), r"cache_seqlens\[1\]"),
    (dict(cache_leftpad=lengths([0, 3, 0], "cpu")), r"cache_leftpad\[1\]"),
    (dict(cache_batch_idx=lengths([0, 1, 3], "cpu")), "cache_batch_idx must be within"),
    (dict(k_cache=torch.zeros(2, 300, 2, 32), v_cache=torch.zeros(2, 300, 2, 32)), "slots for a batch"),
    (dict(block_table=lengths([[0], [1], [2]], "cpu"), cache_batch_idx=lengths([0, 1, 2], "cpu")),
     "cannot be used with block_table"),
    (dict(block_table=lengths([[0], [1]], "cpu")), "block_table must be"),
    (dict(block_table=lengths([[0], [1], [3]], "cpu")), r"block_table\[2\]"),
    (dict(rotary_cos=torch.zeros(300, 8)), "go together"),
    (dict(rotary_cos=torch.zeros(300, 8), rotary_sin=torch.zeros(300, 8), k=None, v=None), "need k and v"),
    (dict(rotary_cos=torch.zeros(299, 8), rotary_sin=torch.zeros(299, 8)), "seqlen_ro"),
    (dict(rotary_cos=torch.zeros(300, 17), rotary_sin=torch.zeros(300, 17)), "rotary_dim"),
    (dict(rotary_cos=torch.zeros(300, 8, dtype=torch.float64), rotary_sin=torch.zeros(300, 8, dtype=torch.float64)),
     "q's dtype"),
    (dict(block_table=torch.zeros(3, 0, dtype=torch.int32)), "block_table must be"),
    (dict(alibi_slopes=torch.zeros(2, 4)), "alibi_slopes"),
    (dict(alibi_slopes=torch.zeros(4, dtype=torch.float64)), "alibi_slopes"),
])
def test_bad_arguments_raise(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        flash_attn_with_kvcache(**cpu_case(**overrides))


def test_checked_lengths_are_read_once(monkeypatch):
    """The lengths of a decode step are read back to the host once for all of a model's layers,
    and again once modified in place."""
    monkeypatch.setattr(kvcache_module, "_attention", varlen_stand_in)
    reads = []
    real = kvcache_module._host_list
    monkeypatch.setattr(kvcache_module, "_host_list", lambda *a: reads.append(1) or real(*a))
    args = cpu_case()
    for _ in range(3):
        flash_attn_with_kvcache(**args)
    assert len(reads) == 2  # cache_seqlens and cache_leftpad, once
    args["cache_seqlens"] += 1
    flash_attn_with_kvcache(**args)
    assert len(reads) == 4
