"""Host time per call against GPU time, for ours and SDPA flash on one paper-grid shape.

For small shapes the host can take nearly as long to issue a call as the GPU takes to run it; then
any host jitter shows up in the benchmark as idle GPU time. For each direction (fwd, bwd,
fwd_bwd), 200 calls are issued without synchronizing: "host" is the time to issue them, "wall"
the time until the GPU is done, both per call.
--profile adds torch.profiler's CPU table of one fwd_bwd per implementation (50 calls).
--layers times each layer of ours and of SDPA flash alone, from the op without autograd up to the
public function and autograd, so that the host time can be assigned to a layer."""

import argparse
import time

import torch

import benchmark_attn
from flash_attn_cuda import _extension, flash_attn_func

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


def profile_table(fn, calls, activities, rows):
    """torch.profiler's table of calls calls of fn, by self CPU time."""
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)


def layer_calls(q, k, v, causal):
    """(name, no-argument call) for each layer of one forward and one backward, ours and SDPA
    flash's, each layer adding one wrapper to the one above it."""
    ops = _extension.ops()
    scale = q.shape[-1] ** -0.5
    dout = torch.randn_like(q)
    out, lse, *_ = ops.fwd(q, k, v, None, None, 0, 0, scale, causal, -1, -1, 0.0, None, False, 0.0, False)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    stored = flash_attn_func(qg, kg, vg, causal=causal)

    aten = torch.ops.aten
    qt, kt, vt, dout_t = (t.transpose(1, 2) for t in (q, k, v, dout))
    sdpa_fwd = aten._scaled_dot_product_flash_attention.default
    sdpa_bwd = aten._scaled_dot_product_flash_attention_backward.default
    o, lse_s, cum_q, cum_k, max_q, max_k, seed, offset, _ = sdpa_fwd(qt, kt, vt, 0.0, causal, scale=scale)
    qgt, kgt, vgt = (t.detach().requires_grad_() for t in (qt, kt, vt))
    sdpa_stored = torch.nn.functional.scaled_dot_product_attention(qgt, kgt, vgt, is_causal=causal)
    sdpa_public = benchmark_attn.attention_fn("sdpa_flash", causal)
    return [
        ("ours fwd: op", lambda: ops.fwd(q, k, v, None, None, 0, 0, scale, causal, -1, -1, 0.0, None, False, 0.0, False)),
        ("ours fwd: op, inputs requiring grad", lambda: ops.fwd(qg, kg, vg, None, None, 0, 0, scale, causal, -1, -1, 0.0, None, False, 0.0, False)),
        ("ours fwd: flash_attn_func", lambda: flash_attn_func(qg, kg, vg, causal=causal)),
        ("ours bwd: op", lambda: ops.bwd(dout, q, k, v, out, lse, None, None, None, 0, 0, scale, causal, -1, -1, 0.0, None, False, 0.0, False)),
        ("ours bwd: autograd.grad", lambda: torch.autograd.grad(stored, (qg, kg, vg), dout, retain_graph=True)),
        ("sdpa fwd: aten op", lambda: sdpa_fwd(qt, kt, vt, 0.0, causal, scale=scale)),
        ("sdpa fwd: F.sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(qgt, kgt, vgt, is_causal=causal)),
        ("sdpa fwd: + sdpa_kernel, transposes", lambda: sdpa_public(qg, kg, vg)),
        ("sdpa bwd: aten op", lambda: sdpa_bwd(dout_t, qt, kt, vt, o, lse_s, cum_q, cum_k, max_q, max_k, 0.0, causal,
                                             seed, offset, scale=scale)),
        ("sdpa bwd: autograd.grad",
         lambda: torch.autograd.grad(sdpa_stored, (qgt, kgt, vgt), dout_t, retain_graph=True)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    benchmark_attn.add_shape_arguments(parser, seqlen=512)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--layers", action="store_true")
    args = parser.parse_args()
    q, k, v = benchmark_attn.grid_inputs(args.seqlen, args.head_dim)
    batch, _, nheads, _ = q.shape
    print(f"batch {batch}, seqlen {args.seqlen}, heads {nheads}, head dim {args.head_dim}, causal {args.causal}")
    if args.layers:
        for name, fn in layer_calls(q, k, v, args.causal):
            host, wall = per_call_us(fn, calls=100)
            print(f"{name:40s} host {host:7.1f} us/call, wall {wall:7.1f} us/call")
    for impl in IMPLS:
        for direction in ("fwd", "bwd", "fwd_bwd"):
            host, wall = per_call_us(benchmark_attn.make_call(impl, q, k, v, args.causal, direction))
            print(f"{impl:16s} {direction:8s} host {host:7.1f} us/call, wall {wall:7.1f} us/call")
        if args.profile:
            fn = benchmark_attn.make_call(impl, q, k, v, args.causal, "fwd_bwd")
            print(profile_table(fn, 50, [torch.profiler.ProfilerActivity.CPU], 15))


if __name__ == "__main__":
    main()
