"""A captured decode step's GPU time with its replays queued behind a sleep, so that the GPU runs
them back to back and the host's launch time does not count, and the host time of one replay:
which of the two a graphed timing measures (benchmark_kvcache.py's problem and impls). Each replay
finds the previous one's K and V in L2 where they fit (~50 MB: batch 8 at 1k keys, not at 16k),
where do_bench's timings clear L2 before each call: compare impls within this tool only.

python benchmarks/kvcache_queued.py [--batches 1,8] [--lengths 1024,16384] [--impls ...] [--replays 300]
"""

import argparse
import time

import torch

from benchmark_kvcache import add_step_arguments, steps

IMPLS = ["flash_attn_cuda@graph", "flash_attn_cuda_paged@graph", "sdpa_cudnn@graph"]
SLEEP_CYCLES = 200_000_000  # ~0.1 s: longer than the host takes to queue the replays


def queued_us(fn, replays):
    """(host us per call of fn, GPU us per call) over replays calls queued behind a sleep."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    begin = time.perf_counter()
    start.record()
    for _ in range(replays):
        fn()
    end.record()
    host = (time.perf_counter() - begin) / replays * 1e6
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / replays * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, IMPLS)
    parser.add_argument("--replays", type=int, default=300)
    args = parser.parse_args()
    for batch, cache_len, impl, step in steps(args):
        host, gpu = queued_us(step, args.replays)
        print(f"batch {batch:4d} cache {cache_len:6d} {impl:30s} host/call {host:7.1f} us  GPU/call {gpu:8.1f} us",
              flush=True)


if __name__ == "__main__":
    main()
