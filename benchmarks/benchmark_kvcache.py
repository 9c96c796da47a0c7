"""Decoding over a KV cache: one step of one query token per sequence against caches of equal
length, GQA (Llama-style 32 query heads over 8 KV heads), through flash_attn_with_kvcache and
PyTorch SDPA.

python benchmarks/benchmark_kvcache.py [--json] [--batches 1,4,16,64] [--lengths 1024,4096,16384] [--window W]

Implementations (the caches hold cache_len tokens per sequence, capacity cache_len + 256):
  flash_attn_cuda          flash_attn_with_kvcache over the cache (cache_seqlens a tensor), split-KV
                           as its heuristic picks it (num_splits=0)
  flash_attn_cuda_nosplit  the same with num_splits=1
  flash_attn_cuda_append   a whole decode step: the new token's k and v rotated (rotary_dim 128)
                           and written into the cache, then the attention
  flash_attn_cuda_paged    the cache in pages of 256 tokens through block_table (the Hopper family
                           reads the pages in place; the FA2 family gets a gathered copy per call)
  sdpa_flash, sdpa_cudnn   SDPA on the cache's first cache_len rows (a view), enable_gqa (SDPA
                           efficient and math take no GQA without copies; not run)
  <impl>@graph             impl captured once in a CUDA graph and replayed (how decoding loops run
                           where the host's time per step matters): ours then builds the sequence
                           offsets on the device instead of on the host
Bandwidth is the bytes of the keys and values attended (batch * cache_len * nheads_k * d * 2 * 2)
over the time: a decode step is bound by reading the cache.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import benchmark_attn
from benchmark_attn import SDPA_BACKENDS, metadata, time_ms
from flash_attn_cuda import flash_attn_with_kvcache

DEVICE = "cuda"
NHEADS, NHEADS_K, HEAD_DIM = 32, 8, 128
SPARE = 256  # capacity beyond the cached tokens
PAGE = 256
SDPA = ["sdpa_flash", "sdpa_cudnn"]
IMPLS = ["flash_attn_cuda", "flash_attn_cuda@graph", "flash_attn_cuda_nosplit@graph", "flash_attn_cuda_append",
         "flash_attn_cuda_append@graph", "flash_attn_cuda_paged", "sdpa_flash", "sdpa_flash@graph", "sdpa_cudnn",
         "sdpa_cudnn@graph"]


def make_inputs(batch, cache_len, dtype):
    capacity = cache_len + SPARE
    q = torch.randn(batch, 1, NHEADS, HEAD_DIM, device=DEVICE, dtype=dtype)
    k_cache, v_cache = (torch.randn(batch, capacity, NHEADS_K, HEAD_DIM, device=DEVICE, dtype=dtype)
                        for _ in range(2))
    new_k, new_v = (torch.randn(batch, 1, NHEADS_K, HEAD_DIM, device=DEVICE, dtype=dtype) for _ in range(2))
    angles = torch.arange(capacity, device=DEVICE)[:, None] * 1e-4 ** (torch.arange(HEAD_DIM // 2, device=DEVICE)
                                                                       / (HEAD_DIM // 2))
    blocks = capacity // PAGE
    block_table = torch.randperm(batch * blocks, device=DEVICE).reshape(batch, blocks).to(torch.int32)
    pages = [c.reshape(batch * blocks, PAGE, NHEADS_K, HEAD_DIM) for c in (k_cache, v_cache)]
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "new_k": new_k, "new_v": new_v,
            "cos": angles.cos().to(dtype), "sin": angles.sin().to(dtype), "block_table": block_table,
            "pages": pages, "seqlens": torch.full((batch,), cache_len, dtype=torch.int32, device=DEVICE)}


def call(impl, x, cache_len, window=None):
    """A no-argument function running impl once on the inputs x; with a window, ours under
    window_size=(window, 0) and SDPA on the keys it leaves (the last window + 1)."""
    if impl.endswith("@graph"):
        return graphed(call(impl.removesuffix("@graph"), x, cache_len, window))
    q, k_cache, v_cache, seqlens = x["q"], x["k_cache"], x["v_cache"], x["seqlens"]
    options = {} if window is None else {"window_size": (window, 0)}
    if impl == "flash_attn_cuda":
        return lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, **options)
    if impl == "flash_attn_cuda_nosplit":
        return lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=1, **options)
    if impl == "flash_attn_cuda_append":
        before = seqlens - 1  # the new token is the cache_len-th, written at the same row every call
        return lambda: flash_attn_with_kvcache(q, k_cache, v_cache, x["new_k"], x["new_v"], rotary_cos=x["cos"],
                                               rotary_sin=x["sin"], cache_seqlens=before, causal=True, **options)
    if impl == "flash_attn_cuda_paged":
        k_pages, v_pages = x["pages"]
        return lambda: flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                               block_table=x["block_table"], **options)
    backend = SDPA_BACKENDS[impl]
    first = 0 if window is None else max(0, cache_len - window - 1)
    keys, values = (c[:, first:cache_len].transpose(1, 2) for c in (k_cache, v_cache))

    def sdpa():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, enable_gqa=True)

    return sdpa


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream): its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def add_step_arguments(parser, impls):
    """--batches, --lengths and --impls of the tools that take one decoding step apart
    (kvcache_kernels.py, kvcache_queued.py)."""
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--lengths", default="1024,16384")
    parser.add_argument("--impls", default=",".join(impls))


def steps(args):
    """(batch, cache_len, impl, a function running its step once) for each problem of args
    (add_step_arguments), bf16, the inputs made once per problem."""
    for batch in (int(b) for b in args.batches.split(",")):
        for cache_len in (int(n) for n in args.lengths.split(",")):
            x = make_inputs(batch, cache_len, torch.bfloat16)
            for impl in args.impls.split(","):
                yield batch, cache_len, impl, call(impl, x, cache_len)


def bench(impl, x, cache_len, window):
    try:
        return time_ms(call(impl, x, cache_len, window)), "ok"
    except (RuntimeError, torch.OutOfMemoryError) as err:
        torch.cuda.synchronize()
        return None, f"error: {str(err).splitlines()[0][:160]}"


def print_table(rows, impls):
    label = {impl: impl.replace("flash_attn_cuda", "ours").replace("@graph", "@g") for impl in impls}
    print(f"{'batch':>5} {'cache':>6} " + " ".join(f"{label[impl]:>12}" for impl in impls)
          + "   (us; ours' GB/s eager and graphed; SDPA's time / ours', eager and graphed)")
    cells = {}
    for r in rows:
        cells.setdefault((r["batch"], r["cache_len"]), {})[r["impl"]] = r
    for (batch, cache_len), by_impl in cells.items():
        ms = {impl: by_impl.get(impl, {}).get("ms") for impl in impls}
        times = " ".join(f"{ms[i] * 1e3:12.1f}" if ms[i] else f"{'-':>12}" for i in impls)
        extra = []
        for suffix in ("", "@graph"):
            ours = ms.get("flash_attn_cuda" + suffix)
            if ours:
                extra.append(f"{by_impl['flash_attn_cuda' + suffix]['gbps']:5.0f}")
                extra += [f"{name[5:]}{suffix[:2]} {ms[name + suffix] / ours:.2f}" for name in SDPA
                          if ms.get(name + suffix)]
        print(f"{batch:5d} {cache_len:6d} {times}   " + " ".join(extra))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--json", action="store_true", help="write results/kvcache_h100.json and its metadata")
    parser.add_argument("--window", type=int, help="a sliding window (window, 0): ours under it, SDPA on its keys")
    args = parser.parse_args()
    impls = args.impls.split(",")
    dtype = benchmark_attn.DTYPES[args.dtype]
    rows, start = [], time.perf_counter()
    for batch in (int(b) for b in args.batches.split(",")):
        for cache_len in (int(n) for n in args.lengths.split(",")):
            x = make_inputs(batch, cache_len, dtype)
            attended = cache_len if args.window is None else min(cache_len, args.window + 1)
            nbytes = 2 * batch * attended * NHEADS_K * HEAD_DIM * x["q"].element_size()
            for impl in impls:
                ms, status = bench(impl, x, cache_len, args.window)
                rows.append({"impl": impl, "batch": batch, "cache_len": cache_len, "window": args.window,
                             "hdim": HEAD_DIM, "nheads": NHEADS, "nheads_k": NHEADS_K, "dtype": args.dtype, "ms": ms,
                             "gbps": nbytes / (ms * 1e6) if ms else None, "status": status})
            del x
    print_table(rows, impls)
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.json:
        benchmark_attn.write_result("kvcache_h100.json", rows)
        benchmark_attn.write_result("kvcache_h100_meta.json", metadata())


if __name__ == "__main__":
    main()
