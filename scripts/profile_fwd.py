"""One forward problem run a few times, for ncu (scripts/gpu_check.sh, PROFILE=1): bf16, 16k
tokens per batch, hidden 2048, as the benchmark grid.

python scripts/profile_fwd.py HEAD_DIM SEQLEN CAUSAL(0|1) [CALLS] [SOFTCAP]"""

import sys

import torch

from flash_attn_cuda import flash_attn_func

head_dim, seqlen, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
calls = int(sys.argv[4]) if len(sys.argv) > 4 else 3
softcap = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
batch, nheads = 16384 // seqlen, 2048 // head_dim
q, k, v = (torch.randn(batch, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(calls):
    flash_attn_func(q, k, v, causal=causal, softcap=softcap)
torch.cuda.synchronize()
