"""What bounds the forward's short cells: beside ours and SDPA's cuDNN backend, the same process times
(a) the forward's bytes streamed by one elementwise kernel (torch.addcmul reads q, k and v once and
writes o once: the forward's own minimum traffic, 4 * batch * seqlen * hidden * 2 bytes, the same in
every cell of the grid) and (b) a large bf16 GEMM, whose rate turns the cell's FLOPs into a time. The
larger of the two bounds a forward from below, up to what a better streaming kernel than PyTorch's
would gain (it reaches ~2.83 of the H100's 3.35 TB/s); the table gives, for issue 16's target (1.1x
cuDNN's time), what share of that bound the target leaves.

python benchmarks/forward_bounds.py [--hdims 64,128,256] [--seqlens 512,1024,2048] [--json]
"""

import argparse

import torch

from benchmark_attn import attention_flops, attention_fn, grid_inputs, metadata, time_ms, write_result
from gpu_clocks import ClockSampler

TARGET = 1.1  # issue 16: forward >= 1.1x SDPA cuDNN
GEMM_SIZE = 8192


def gemm_tflops():
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * GEMM_SIZE**3 / time_ms(lambda: a @ b) / 1e9


def forward_bytes(q):
    """q, k and v read once, o written once (all of q's shape and type)."""
    return 4 * q.numel() * q.element_size()


def flop_ms(flops, tflops):
    return flops / (tflops * 1e9)


def bound_ms(stream_ms, flops, tflops):
    """The larger of the time to stream the bytes and the time for the FLOPs at the GEMM rate."""
    return max(stream_ms, flop_ms(flops, tflops))


def cell(hdim, causal, seqlen, tflops):
    q, k, v = grid_inputs(seqlen, hdim)
    o = torch.empty_like(q)
    ours, cudnn = (time_ms(lambda f=attention_fn(i, causal): f(q, k, v)) for i in ("flash_attn_cuda", "sdpa_cudnn"))
    stream = time_ms(lambda: torch.addcmul(q, k, v, out=o))
    flops = attention_flops(seqlen, hdim, q.shape[2], q.shape[0], causal, "fwd")
    bound = bound_ms(stream, flops, tflops)
    return {"hdim": hdim, "causal": causal, "seqlen": seqlen, "ours_ms": ours, "cudnn_ms": cudnn,
            "stream_ms": stream, "stream_tb_s": forward_bytes(q) / stream / 1e9,
            "flop_ms": flop_ms(flops, tflops), "bound_ms": bound,
            "ours_share": bound / ours, "cudnn_share": bound / cudnn, "target_share": bound * TARGET / cudnn}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hdims", default="64,128,256")
    parser.add_argument("--seqlens", default="512,1024,2048")
    parser.add_argument("--json", action="store_true", help="write results/forward_bounds_h100.json")
    args = parser.parse_args()
    meta = metadata()
    with ClockSampler() as clocks:
        tflops = gemm_tflops()
        rows = [cell(h, c, s, tflops) for h in (int(x) for x in args.hdims.split(","))
                for c in (False, True) for s in (int(x) for x in args.seqlens.split(","))]
    meta.update(gemm_tflops=tflops, clocks=clocks.summary)
    print(meta)
    print("share = bound / time: how close a forward runs to the larger of its streaming and GEMM times")
    print("d causal seqlen | ours cudnn stream flops (ms) | stream TB/s | ours/cudnn | share: ours cudnn target")
    for r in rows:
        print(f"{r['hdim']} {int(r['causal'])} {r['seqlen']} | {r['ours_ms']:.4f} {r['cudnn_ms']:.4f} "
              f"{r['stream_ms']:.4f} {r['flop_ms']:.4f} | {r['stream_tb_s']:.2f} | {r['cudnn_ms'] / r['ours_ms']:.3f} | "
              f"{r['ours_share']:.3f} {r['cudnn_share']:.3f} {r['target_share']:.3f}")
    if args.json:
        write_result("forward_bounds_h100.json", {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
