"""A few small forward and backward calls with odd shapes, for compute-sanitizer:
    compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize.py
Every kernel runs: forward, backward preprocess, main and postprocess, deterministic or not; the
packed ops write the gradient of qkv through views of one tensor."""

import os

import torch

from flash_attn_cuda import (_extension, flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                             flash_attn_with_kvcache)
from flash_attn_cuda import kvcache as kvcache_module

built = _extension.load().built_config()
dtype = torch.bfloat16 if "bf16" in built["dtypes"] else torch.float16


def forward_backward(label, shape_q, shape_k, **kwargs):
    """flash_attn_func forward and backward on fresh random padded inputs, q of shape_q and k, v of
    shape_k (batch, seqlen, heads, head_dim), then a synchronize, so that an error is this call's."""
    q = torch.randn(*shape_q, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(*shape_k, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = flash_attn_func(q, k, v, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print(f"{label}: ok")


for head_dim in sorted({min(built["head_dims"]) - 5, max(built["head_dims"])}):
    for causal in (False, True):
        for seqlen_q, seqlen_k in ((113, 203), (203, 113), (1, 77)):
            forward_backward(f"d={head_dim} causal={causal} seqlen_q={seqlen_q} seqlen_k={seqlen_k}",
                             (2, seqlen_q, 4, head_dim), (2, seqlen_k, 2, head_dim), causal=causal,
                             deterministic=seqlen_q > seqlen_k)

# Up to 64 query rows against many keys: the Hopper forward's split-block kernels (d <= 128), an odd
# number of 64-key blocks, a window that leaves the second warpgroup few.
for head_dim in sorted({64, 128} & set(built["head_dims"])):
    for causal, window_size in ((False, (-1, -1)), (True, (-1, -1)), (True, (100, 0))):
        forward_backward(f"split blocks d={head_dim} causal={causal} window={window_size}", (3, 5, 8, head_dim),
                         (3, 700, 2, head_dim), causal=causal, window_size=window_size)

# Varlen: lengths 0, 1 and off the block sizes, the last sequence ending at the tensors' end.
lengths_q, lengths_k = [0, 1, 130, 77], [5, 0, 190, 1]
cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
              for n in (lengths_q, lengths_k))
head_dim = max(built["head_dims"])
for causal in (False, True):
    q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                 deterministic=causal)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print(f"varlen d={head_dim} causal={causal}: ok")

# Varlen whose last sequence is the shortest by Q blocks: the backward's grids span the longest
# sequence, and the accumulator's rows end with the last sequence's last Q block, on each family.
for head_dim in sorted({min(built["head_dims"]), max(built["head_dims"])}):
    for family in ("sm80", "sm90"):
        os.environ["FLASH_ATTN_CUDA_FAMILY"] = family
        cu = torch.tensor([0, 300, 320], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(320, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        out = flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"varlen, the last sequence shortest, d={head_dim} family={family}: ok")
os.environ.pop("FLASH_ATTN_CUDA_FAMILY", None)
head_dim = max(built["head_dims"])

qkv = torch.randn(2, 203, 3, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
out = flash_attn_qkvpacked_func(qkv, causal=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print(f"qkvpacked d={head_dim} causal=True: ok")

# The Hopper family's paths at d <= 128 (O in its own shared-memory buffer, the next tile's Q loading
# during the epilogue): varlen tails, tiles that see no key (a window right of the sequence's end),
# a deterministic window; at d = 64 and 128 where built.
for head_dim in [d for d in (64, 128) if d in built["head_dims"]]:
    q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), window_size=(3, 0),
                                 deterministic=True)
    out.backward(torch.randn_like(out))
    q = torch.randn(3, 517, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(3, 140, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = flash_attn_func(q, k, v, window_size=(5, 2))
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print(f"varlen window, empty tiles d={head_dim}: ok")

# The variants: a window with both edges, one left-only with causal, softcap with ALiBi; each on the
# default family (the Hopper one where built, for what it supports) and on the FA2 family forced.
slopes = torch.rand(4, device="cuda")
for forced in (None, "sm80"):
    if forced:
        os.environ["FLASH_ATTN_CUDA_FAMILY"] = forced
    for variant in ({"window_size": (40, 7)}, {"causal": True, "window_size": (64, -1)},
                    {"softcap": 20.0, "alibi_slopes": slopes}):
        forward_backward(f"variant {sorted(variant)} family={forced or 'default'}", (2, 203, 4, head_dim),
                         (2, 150, 2, head_dim), **variant)
os.environ.pop("FLASH_ATTN_CUDA_FAMILY", None)

# Dropout (the FA2 family's dropout kernels, with and without the probabilities written), padded and
# varlen, causal and windowed.
for variant in ({"dropout_p": 0.3, "return_attn_probs": True}, {"dropout_p": 0.1, "causal": True},
                {"dropout_p": 0.2, "window_size": (30, 5)}):
    forward_backward(f"dropout {sorted(variant)}", (2, 203, 4, head_dim), (2, 150, 2, head_dim), **variant)
q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
v = torch.randn_like(k, requires_grad=True)
out, _, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), dropout_p=0.25, causal=True,
                                   return_attn_probs=True)
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
print("varlen dropout with probabilities: ok")

# d = 64: the Hopper family's 3-warpgroup tiles (csrc/sm90/fwd_tile_config.h), forward only: a long
# causal problem with more query than key rows, and a window on 64 sequences (enough tiles), whose
# warpgroups visit different KV blocks, the last tile's third with no row in the sequence (2000 rows).
if 64 in built["head_dims"]:
    q = torch.randn(1, 8250, 1, 64, device="cuda", dtype=dtype)
    k = torch.randn(1, 8200, 1, 64, device="cuda", dtype=dtype)
    flash_attn_func(q, k, torch.randn_like(k), causal=True)
    q = torch.randn(4, 2000, 16, 64, device="cuda", dtype=dtype)
    k = torch.randn(4, 2000, 8, 64, device="cuda", dtype=dtype)
    flash_attn_func(q, k, torch.randn_like(k), window_size=(100, 50))
    torch.cuda.synchronize()
    print("causal and window, 3 warpgroups d=64: ok")

# The Hopper forward's steps at the rows' current max (csrc/sm90/fwd_consumer.h), plain and causal
# ALiBi: 600 rows, so that a tile's warpgroups settle on the diagonal and first unmasked blocks; the
# first 64 keys lift every score by ~40, so the last block visited overflows the partial sums and the
# warpgroups vote and compute S again.
for head_dim in [d for d in (64, 128) if d in built["head_dims"]]:
    for variant in ({"causal": True}, {"causal": True, "alibi_slopes": slopes}, {}):
        q = torch.randn(2, 600, 4, head_dim, device="cuda", dtype=dtype)
        k = torch.randn(2, 600, 2, head_dim, device="cuda", dtype=dtype)
        q[..., 0] = 1.0
        k[:, :64, :, 0] = 40.0 * head_dim**0.5
        flash_attn_func(q, k, torch.randn_like(k), **variant)
        torch.cuda.synchronize()
        print(f"steps at the current max, a jump in the max, d={head_dim} {sorted(variant)}: ok")

# d > 128 (one Q buffer): O through a buffer of its own that the two consumer warpgroups take in
# turn, tile after tile: several tiles per block, and varlen tails (row copies instead of the TMA).
if max(built["head_dims"]) > 128:
    head_dim = max(built["head_dims"])
    q = torch.randn(2, 300, 100, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(2, 200, 100, head_dim, device="cuda", dtype=dtype)
    flash_attn_func(q, k, torch.randn_like(k), causal=True)
    lengths = torch.tensor([0, 77, 130, 1, 64, 200] * 20)
    cu = torch.tensor([0, *lengths.cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(int(lengths.sum()), 8, head_dim, device="cuda", dtype=dtype)
    flash_attn_varlen_func(q, q, q, cu, cu, int(lengths.max()), int(lengths.max()))
    torch.cuda.synchronize()
    print(f"O buffer in turn, several tiles per block d={head_dim}: ok")

# The Hopper backward (d = 64, 128 and 256), forced on these short problems: several Q blocks per KV
# block, so that its dS, dQ staging and dropout buffers are reused, a partial last KV block, GQA;
# plain, with the variants (the kernel with dropout's mask exchange), and deterministic (the dQ
# adds in turn).
os.environ["FLASH_ATTN_CUDA_FAMILY"] = "sm90"
for head_dim in (64, 128, 256):
    if head_dim in built["head_dims"]:
        for variant in ({}, {"causal": True}, {"dropout_p": 0.2, "softcap": 10.0, "alibi_slopes": slopes},
                        {"dropout_p": 0.1, "causal": True}, {"deterministic": True},
                        {"deterministic": True, "causal": True, "softcap": 10.0}):
            forward_backward(f"Hopper backward d={head_dim} {sorted(variant)}", (2, 300, 4, head_dim),
                             (2, 200, 2, head_dim), **variant)
        # More tiles than SMs: each block walks several, reusing its K, V and dropout buffers.
        for variant in ({}, {"dropout_p": 0.2, "window_size": (100, 50)}, {"deterministic": True}):
            forward_backward(f"Hopper backward, several tiles per block, d={head_dim} {sorted(variant)}",
                             (2, 150, 50, head_dim), (2, 300, 50, head_dim), **variant)
        # Varlen: sequences without queries or keys, tiles past a sequence's keys, the last
        # sequence ending at the tensors' end.
        for variant in ({}, {"causal": True, "dropout_p": 0.2, "softcap": 10.0}, {"causal": True, "deterministic": True}):
            q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn_like(k, requires_grad=True)
            out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **variant)
            out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
            print(f"Hopper backward, varlen d={head_dim} {sorted(variant)}: ok")
os.environ.pop("FLASH_ATTN_CUDA_FAMILY", None)

# flash_attn_with_kvcache: a cache read in place as a varlen batch whose sequences without queries
# span the rows between slots (left padding, the ends of slots, the slot order of cache_batch_idx),
# split-KV decoding, a paged cache; on each family.
for family in ("sm80", "sm90"):
    os.environ["FLASH_ATTN_CUDA_FAMILY"] = family
    head_dim = max(built["head_dims"])
    q = torch.randn(3, 1, 8, head_dim, device="cuda", dtype=dtype)
    k_cache, v_cache = (torch.randn(4, 700, 2, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    new_k, new_v = (torch.randn(3, 1, 2, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    seqlens, leftpad, slots = (torch.tensor(t, dtype=torch.int32, device="cuda")
                               for t in ([0, 690, 301], [0, 20, 300], [3, 0, 1]))
    flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens, cache_leftpad=leftpad,
                            cache_batch_idx=slots, num_splits=3)
    # Captured: the offsets from the layout kernel, the slots gathered. A capture allocates from the
    # caching allocator's private pool, so not where the sanitizer runs without it
    # (PYTORCH_NO_CUDA_MEMORY_CACHING=1, for memcheck's bounds): there cudaMalloc fails the capture.
    if "PYTORCH_NO_CUDA_MEMORY_CACHING" not in os.environ:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=seqlens, cache_leftpad=leftpad,
                                    cache_batch_idx=slots, num_splits=3)
        graph.replay()
    # The layout kernel that a capture runs, with the chunks' query rows (a KV head's query heads).
    kvcache_module._device_layout(seqlens, leftpad, capacity=700, batch=3, seqlen_new=1, rows_per_slot=700, rows=4,
                                  splits=3, total_rows=4 * 700, device=torch.device("cuda"),
                                  q_rows=q.reshape(3, 2, 4, head_dim).transpose(1, 2))
    # A sliding window over one query row: the layout keeps its last left + 1 keys, on the host and
    # in the layout kernel.
    flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, cache_leftpad=leftpad, window_size=(100, 0),
                            num_splits=2)
    kvcache_module._device_layout(seqlens, leftpad, capacity=700, batch=3, seqlen_new=0, rows_per_slot=700, rows=4,
                                  splits=2, total_rows=4 * 700, device=torch.device("cuda"), window_left=100)
    # One row per KV head of a batch of one, every chunk seeing it (copied from a broadcast view).
    flash_attn_with_kvcache(q[:1, :, :2], k_cache[:1], v_cache[:1], cache_seqlens=seqlens[1:2], num_splits=4)
    flash_attn_with_kvcache(q.expand(3, 5, 8, head_dim), k_cache, v_cache, cache_seqlens=seqlens, causal=True,
                            cache_leftpad=leftpad)
    table = torch.randperm(9, device="cuda").reshape(3, 3).to(torch.int32)
    k_pages, v_pages = (torch.randn(9, 256, 2, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    flash_attn_with_kvcache(q, k_pages, v_pages, new_k, new_v, cache_seqlens=seqlens, block_table=table)
    # Split, the pages read in place by the Hopper family (a chunk ends inside a page).
    flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table, num_splits=3)
    torch.cuda.synchronize()
    print(f"kvcache family={family}: ok")
os.environ.pop("FLASH_ATTN_CUDA_FAMILY", None)
