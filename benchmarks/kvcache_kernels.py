"""The kernels of one decode step (benchmark_kvcache.py's problem) and the GPU time of each, from
torch.profiler over repeated steps, for ours and SDPA cuDNN, eager and captured in a CUDA graph:
where a short step's time goes. Kernels launched dependent (programmatic dependent launch) start
before the one they wait for ends, so their times overlap; the timeline (the last step's kernels,
start and end from the step's first kernel start) shows where each one's time lies.

python benchmarks/kvcache_kernels.py [--batches 1,8] [--lengths 1024,16384] [--impls ...] [--steps 50]
"""

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmark_kvcache import add_step_arguments, steps

IMPLS = ["flash_attn_cuda", "flash_attn_cuda@graph", "flash_attn_cuda_append@graph", "sdpa_cudnn@graph"]


def kernel_times(fn, steps):
    """{kernel name: (launches per step, GPU us per step)} over steps calls of fn, the wall us per
    step between the first launch and the last kernel's end, and the last step's kernels as (start,
    end, name), us from its first kernel's start."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(lambda: [0, 0.0])
    kernels = sorted(((event.time_range.start, event.time_range.end, event.name) for event in prof.events()
                      if event.device_type == torch.autograd.DeviceType.CUDA))
    for start, end, name in kernels:
        totals[name][0] += 1
        totals[name][1] += end - start
    span = (kernels[-1][1] - kernels[0][0]) / steps if kernels else 0.0
    per_step = len(kernels) // steps if kernels else 0
    last_step = kernels[len(kernels) - per_step:]
    timeline = [(start - last_step[0][0], end - last_step[0][0], name) for start, end, name in last_step]
    return {name: (count / steps, us / steps) for name, (count, us) in totals.items()}, span, timeline


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, IMPLS)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    for batch, cache_len, impl, step in steps(args):
        times, span, timeline = kernel_times(step, args.steps)
        busy = sum(us for _, us in times.values())
        print(f"batch {batch} cache {cache_len} {impl}: {span:.1f} us per step, kernels {busy:.1f} us")
        for name, (count, us) in sorted(times.items(), key=lambda item: -item[1][1]):
            print(f"    {us:8.2f} us  x{count:4.1f}  {name[:110]}")
        print("    last step (us from its first kernel's start):")
        for start, end, name in timeline:
            print(f"    {start:6.1f} -> {end:6.1f}  {name[:100]}")


if __name__ == "__main__":
    main()
