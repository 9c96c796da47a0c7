"""Our backward and SDPA flash's (FA2) on one paper-grid shape, for Nsight Compute:
    ncu --profile-from-start off --kernel-name regex:bwd --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats python3 benchmarks/profile_bwd.py
Each runs the backward of a stored forward (benchmark_attn.make_call, direction bwd) three times
first, then once more between cudaProfilerStart and Stop, so ncu sees every backward kernel of
that round once (ours: preprocess, main, postprocess; FA2's: its own three). --seqlen,
--head-dim and --causal pick the shape."""

import argparse

import torch

import benchmark_attn


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    batch, nheads = benchmark_attn.TOKENS // args.seqlen, benchmark_attn.HIDDEN // args.head_dim
    shape = (batch, args.seqlen, nheads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    calls = [benchmark_attn.make_call(impl, q, k, v, args.causal, "bwd") for impl in ("flash_attn_cuda", "sdpa_flash")]
    for call in calls:
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled: ours and sdpa_flash backward, batch {batch}, seqlen {args.seqlen}, heads {nheads}, "
          f"head dim {args.head_dim}, causal {args.causal}")


if __name__ == "__main__":
    main()
