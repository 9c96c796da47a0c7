"""Attention variants against their peers, in one process: flash_attn_cuda with a sliding window
against FlexAttention (torch.compile'd, the window as a block mask), and against itself without
the window (variant none, the cost of the variant). Grid: d=64 and 128, seqlen 1k-16k, 16k tokens
per batch, windows (1024, 0) and (256, 256).

python benchmarks/benchmark_variants.py [--json] [--hdims 64,128] [--seqlens ...] [--directions fwd,bwd]

Rows: {variant, impl, direction, hdim, causal, seqlen, batch, nheads, ms, window}; --json writes
results/variants_h100.json as it goes.
"""

import argparse
import json
import pathlib

import torch

from benchmark_attn import DTYPES, HIDDEN, TOKENS, metadata, time_ms
from flash_attn_cuda import flash_attn_func

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
WINDOWS = {"1024,0": (1024, 0), "256,256": (256, 256)}


def flex_window(window, seqlen, nheads, batch):
    """FlexAttention with the window as its block mask, compiled once per shape."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    left, right = window

    def in_window(b, h, q_idx, kv_idx):
        offset = kv_idx - q_idx
        return (offset <= right) & (offset >= -left)

    block_mask = create_block_mask(in_window, None, None, seqlen, seqlen, device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)

    def attend(q, k, v):
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
        return out.transpose(1, 2)

    return attend


def attention(impl, variant, window, seqlen, nheads, batch):
    if impl == "flex":
        return flex_window(window, seqlen, nheads, batch)
    if variant == "window":
        return lambda q, k, v: flash_attn_func(q, k, v, window_size=window)
    return lambda q, k, v: flash_attn_func(q, k, v, causal=window[1] == 0)


def make_call(attend, q, k, v, direction):
    if direction == "fwd":
        return lambda: attend(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hdims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    meta = metadata()
    print(meta)
    rows = []
    cells = [(d, h, s, w) for d in args.directions.split(",") for h in map(int, args.hdims.split(","))
             for s in map(int, args.seqlens.split(",")) for w in WINDOWS]
    for n, (direction, hdim, seqlen, wname) in enumerate(cells, 1):
        window = WINDOWS[wname]
        batch, nheads = TOKENS // seqlen, HIDDEN // hdim
        q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=DTYPES["bf16"]) for _ in range(3))
        # none: the same attention without the window (causal where the window's right side is 0).
        for impl, variant in (("flash_attn_cuda", "window"), ("flash_attn_cuda", "none"), ("flex", "window")):
            try:
                ms = time_ms(make_call(attention(impl, variant, window, seqlen, nheads, batch), q, k, v, direction))
            except Exception as err:  # a peer that cannot run this cell is reported, not fatal
                print(f"  {impl} {variant} {direction} d={hdim} {seqlen} window={window}: {str(err)[:100]}")
                continue
            rows.append(dict(variant=variant, impl=impl, direction=direction, hdim=hdim, causal=window[1] == 0,
                             seqlen=seqlen, batch=batch, nheads=nheads, ms=ms, window=list(window)))
        torch.cuda.empty_cache()
        print(f"[{n}/{len(cells)}] {direction} d={hdim} seqlen={seqlen} window={window}: "
              + " ".join(f"{r['impl']}/{r['variant']}={r['ms']:.3f}ms" for r in rows
                         if (r['direction'], r['hdim'], r['seqlen'], tuple(r['window'])) == (direction, hdim, seqlen, window)))
        if args.json:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / "variants_h100.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"{'dir':4} {'d':>4} {'seqlen':>6} {'window':>10} {'ours ms':>8} {'none ms':>8} {'flex ms':>8} {'x flex':>7} {'cost':>6}")
    for direction, hdim, seqlen, wname in cells:
        window = WINDOWS[wname]
        t = {(r["impl"], r["variant"]): r["ms"] for r in rows
             if (r["direction"], r["hdim"], r["seqlen"], tuple(r["window"])) == (direction, hdim, seqlen, window)}
        ours, none, flex = t.get(("flash_attn_cuda", "window")), t.get(("flash_attn_cuda", "none")), t.get(("flex", "window"))
        fmt = lambda x: f"{x:8.3f}" if x else f"{'-':>8}"
        print(f"{direction:4} {hdim:4d} {seqlen:6d} {str(window):>10} {fmt(ours)} {fmt(none)} {fmt(flex)} "
              f"{(flex / ours if ours and flex else 0):7.2f} {(ours / none if ours and none else 0):6.2f}")


if __name__ == "__main__":
    main()
