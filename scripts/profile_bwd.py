"""Our backward and SDPA flash's (FA2) on one paper-grid shape, for Nsight Compute:
    ncu --profile-from-start off --kernel-name regex:bwd --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats python3 scripts/profile_bwd.py
Three rounds of each first (caches, allocator), then one forward + backward of each between
cudaProfilerStart and Stop, so ncu sees every backward kernel of that round once (ours:
preprocess, main, postprocess; FA2's: its own three). --seqlen, --head-dim and --causal pick the
shape."""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn_cuda import flash_attn_func


def step_ours(q, k, v, causal, dout):
    flash_attn_func(q, k, v, causal=causal).backward(dout)


def step_sdpa_flash(q, k, v, causal, dout):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal)
    out.transpose(1, 2).backward(dout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    batch, nheads = 16384 // args.seqlen, 2048 // args.head_dim
    shape = (batch, args.seqlen, nheads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for step in (step_ours, step_sdpa_flash):
        for _ in range(3):
            step(q, k, v, args.causal, dout)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for step in (step_ours, step_sdpa_flash):
        step(q, k, v, args.causal, dout)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled: ours and sdpa_flash backward, batch {batch}, seqlen {args.seqlen}, heads {nheads}, "
          f"head dim {args.head_dim}, causal {args.causal}")


if __name__ == "__main__":
    main()
