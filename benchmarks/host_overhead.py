"""Host time per call against GPU time, for ours and SDPA flash on one paper-grid shape.

For small shapes the host can take nearly as long to issue a call as the GPU takes to run it; then
any host jitter shows up in the benchmark as idle GPU time. For each direction (fwd, bwd,
fwd_bwd), 200 calls are issued without synchronizing: "host" is the time to issue them, "wall"
the time until the GPU is done, both per call.
--profile adds torch.profiler's CPU table of one fwd_bwd per implementation (50 calls)."""

import argparse
import time

import torch

import benchmark_attn

IMPLS = ("flash_attn_cuda", "sdpa_flash")


def per_call_us(fn, calls=200):
    """(host us, wall us) per call of fn, after 20 warm-up calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    return 1e6 * (issued - start) / calls, 1e6 * (done - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmark_attn.add_shape_arguments(parser, seqlen=512)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    q, k, v = benchmark_attn.grid_inputs(args.seqlen, args.head_dim)
    batch, _, nheads, _ = q.shape
    print(f"batch {batch}, seqlen {args.seqlen}, heads {nheads}, head dim {args.head_dim}, causal {args.causal}")
    for impl in IMPLS:
        for direction in ("fwd", "bwd", "fwd_bwd"):
            host, wall = per_call_us(benchmark_attn.make_call(impl, q, k, v, args.causal, direction))
            print(f"{impl:16s} {direction:8s} host {host:7.1f} us/call, wall {wall:7.1f} us/call")
        if args.profile:
            fn = benchmark_attn.make_call(impl, q, k, v, args.causal, "fwd_bwd")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
