"""Our backward and SDPA flash's (FA2) on one paper-grid shape.

Default: one backward of each between cudaProfilerStart and Stop, for Nsight Compute:
    ncu --profile-from-start off --kernel-name regex:bwd --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats python3 benchmarks/profile_bwd.py
Each runs the backward of a stored forward (benchmark_attn.make_call, direction bwd) three times
first, then once more between cudaProfilerStart and Stop, so ncu sees every backward kernel of
that round once (ours: preprocess, main, postprocess; FA2's: its own three).

--kernel-times: instead, each kernel's GPU time per backward (torch.profiler, 20 rounds) next to
the benchmark's time of the whole call (do_bench), to tell kernel time from launch overhead.
--seqlen, --head-dim and --causal pick the shape; --direction fwd_bwd times forward and backward
together instead of the backward alone."""

import argparse
import collections

import torch

import benchmark_attn

IMPLS = ("flash_attn_cuda", "sdpa_flash")


def kernel_times(call, rounds=20):
    """{kernel name: microseconds per round} of call's CUDA kernels."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            call()
        torch.cuda.synchronize()
    times = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:90]] += event.time_range.elapsed_us() / rounds
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmark_attn.add_shape_arguments(parser, seqlen=4096)
    parser.add_argument("--kernel-times", action="store_true")
    parser.add_argument("--direction", choices=["bwd", "fwd_bwd"], default="bwd")
    args = parser.parse_args()
    q, k, v = benchmark_attn.grid_inputs(args.seqlen, args.head_dim)
    batch, _, nheads, _ = q.shape
    calls = [benchmark_attn.make_call(impl, q, k, v, args.causal, args.direction) for impl in IMPLS]
    for call in calls:
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    title = f"batch {batch}, seqlen {args.seqlen}, heads {nheads}, head dim {args.head_dim}, causal {args.causal}"
    if args.kernel_times:
        for impl, call in zip(IMPLS, calls):
            times = kernel_times(call)
            print(f"{impl} {args.direction}, {title}: do_bench {benchmark_attn.time_ms(call) * 1e3:.1f} us, "
                  f"kernels {sum(times.values()):.1f} us")
            for name, us in times.most_common():
                print(f"  {us:9.1f} us  {name}")
        return
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled: ours and sdpa_flash backward, {title}")


if __name__ == "__main__":
    main()
