"""The kernels of one decode step (benchmark_kvcache.py's problem) and the GPU time of each, from
torch.profiler over repeated steps, for ours and SDPA cuDNN, eager and captured in a CUDA graph:
where a short step's time goes.

python benchmarks/kvcache_kernels.py [--batches 1,8] [--lengths 1024,16384] [--impls ...] [--steps 50]
"""

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmark_kvcache import call, make_inputs

IMPLS = ["flash_attn_cuda", "flash_attn_cuda@graph", "flash_attn_cuda_append@graph", "sdpa_cudnn@graph"]


def kernel_times(fn, steps):
    """{kernel name: (launches per step, GPU us per step)} over steps calls of fn, and the wall us
    per step between the first launch and the last kernel's end."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(lambda: [0, 0.0])
    first, last = None, None
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        totals[event.name][0] += 1
        totals[event.name][1] += event.device_time
        start, end = event.time_range.start, event.time_range.end
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
    span = (last - first) / steps if first is not None else 0.0
    return {name: (count / steps, us / steps) for name, (count, us) in totals.items()}, span


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--lengths", default="1024,16384")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    for batch in (int(b) for b in args.batches.split(",")):
        for cache_len in (int(n) for n in args.lengths.split(",")):
            x = make_inputs(batch, cache_len, torch.bfloat16)
            for impl in args.impls.split(","):
                times, span = kernel_times(call(impl, x, cache_len), args.steps)
                busy = sum(us for _, us in times.values())
                print(f"batch {batch} cache {cache_len} {impl}: {span:.1f} us per step, kernels {busy:.1f} us")
                for name, (count, us) in sorted(times.items(), key=lambda item: -item[1][1]):
                    print(f"    {us:8.2f} us  x{count:4.1f}  {name[:110]}")
            del x


if __name__ == "__main__":
    main()
