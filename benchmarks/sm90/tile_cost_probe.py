"""Per-tile and per-KV-block cost of the forward, by a linear fit over seqlen_k at a fixed
seqlen_q (benchmarks/NOTES.md, thirteenth session): 16k query tokens, hidden 2048, bf16, the
time of each impl in one process; and the same with every head sharing one K/V head (GQA), where
K and V stay in L2.

python benchmarks/sm90/tile_cost_probe.py [--head-dims 64,128] [--seqlen-q 512] [--impls ...]
"""

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmark_attn import attention_fn, time_ms  # noqa: E402

TOKENS, HIDDEN = 16384, 2048


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlen-q", type=int, default=512)
    parser.add_argument("--seqlens-k", default="128,256,512,1024,2048,4096")
    parser.add_argument("--impls", default="flash_attn_cuda,sdpa_cudnn")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    impls = args.impls.split(",")
    sq = args.seqlen_q
    batch = TOKENS // sq
    print(f"seqlen_q {sq}, batch {batch}, causal {args.causal}; ms per call")
    print("d  kv_heads  seqlen_k  " + "  ".join(f"{i:>16}" for i in impls))
    for d in map(int, args.head_dims.split(",")):
        heads = HIDDEN // d
        for kv_heads in (heads, 1):
            for sk in map(int, args.seqlens_k.split(",")):
                q = torch.randn(batch, sq, heads, d, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(batch, sk, kv_heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                row = []
                for impl in impls:
                    fn = attention_fn(impl, args.causal)
                    if impl.startswith("sdpa") and kv_heads != heads:
                        k_, v_ = (t.repeat_interleave(heads // kv_heads, dim=2) for t in (k, v))
                    else:
                        k_, v_ = k, v
                    row.append(time_ms(lambda: fn(q, k_, v_)))
                print(f"{d:<3}{kv_heads:>8}{sk:>10}  " + "  ".join(f"{ms:16.4f}" for ms in row))


if __name__ == "__main__":
    main()
