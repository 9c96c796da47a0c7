"""Split-KV's chunk count swept over decode steps captured in CUDA graphs: the time of
flash_attn_with_kvcache at each num_splits, per batch and cache length, beside what num_splits=0
picks and SDPA cuDNN's time in the same process. The data behind kvcache_splits.auto_splits.

python benchmarks/kvcache_splits.py [--batches 1,4,16,64] [--lengths 1024,4096,16384]
    [--splits 0,1,2,3,4,6,8,12,16] [--heads 32,8] [--head-dim 128]   (0: the automatic count)

Each time is the median over rounds of a graph of --calls steps, divided by the steps (us).
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmark_kvcache import SPARE, graphed
from flash_attn_cuda import flash_attn_with_kvcache


def graph_us(fn, calls, rounds):
    """The median time of one call of fn, over rounds replays of a graph of calls calls."""
    replay = graphed(lambda: [fn() for _ in range(calls)])
    for _ in range(3):
        replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--splits", default="0,1,2,3,4,6,8,12,16")
    parser.add_argument("--heads", default="32,8", help="query heads, KV heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    nheads, nheads_k = (int(h) for h in args.heads.split(","))
    splits = [int(s) for s in args.splits.split(",")]
    d = args.head_dim
    print(f"heads {nheads}/{nheads_k}, d={d}, graphed steps, us; 'best' is the fastest num_splits >= 1")
    print(f"{'batch':>5} {'cache':>6} " + " ".join(f"{'s=' + str(s):>7}" for s in splits)
          + f" {'cudnn':>7} {'best':>5} {'auto/best':>9} {'auto/cudnn':>10}")
    for batch in (int(b) for b in args.batches.split(",")):
        for cache_len in (int(n) for n in args.lengths.split(",")):
            capacity = cache_len + SPARE
            q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=torch.bfloat16)
            k_cache, v_cache = (torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=torch.bfloat16)
                                for _ in range(2))
            seqlens = torch.full((batch,), cache_len, dtype=torch.int32, device="cuda")
            times = {s: graph_us(lambda s=s: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                                      num_splits=s), args.calls, args.rounds)
                     for s in splits}
            keys, values = (c[:, :cache_len].transpose(1, 2) for c in (k_cache, v_cache))

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, enable_gqa=True)

            cudnn_us = graph_us(cudnn, args.calls, args.rounds)
            best = min((s for s in splits if s >= 1), key=times.get)
            auto = times.get(0)
            ratios = f"{auto / times[best]:9.2f} {auto / cudnn_us:10.2f}" if auto else ""
            print(f"{batch:5d} {cache_len:6d} " + " ".join(f"{times[s]:7.1f}" for s in splits)
                  + f" {cudnn_us:7.1f} {best:5d} {ratios}", flush=True)
            del q, k_cache, v_cache, keys, values


if __name__ == "__main__":
    main()
