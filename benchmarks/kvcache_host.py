"""Host time of an eager (ungraphed) decode call and where it goes.

python benchmarks/kvcache_host.py [--batches 1,8] [--length 1024] [--profile] [--trace]

Without a CUDA graph a decode step is host-bound: the GPU finishes a call sooner than the host can
issue the next. Per call, after warm-up, "host" is the time to issue 1000 calls without
synchronizing and "wall" the time until the GPU is done. The layers below the public call are
timed on the arguments the call passed them (recorded from one call): the op kvcache_attention,
and the pieces of its torch composition (_chunks_attention_torch): the forward through
`_attention`, the fwd op bare and in inference mode, the merge; flash_attn_func on the cache's keys
and SDPA (its default choice and cuDNN) are the peers. --profile adds cProfile's
table of the public call (its own overhead included), --trace torch.profiler's table of the host
side of the op kvcache_attention (its torch calls and the CUDA runtime calls)."""

import argparse
import cProfile
import pstats

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmark_kvcache import make_inputs
from host_overhead import per_call_us, profile_table
from flash_attn_cuda import _extension, flash_attn_func, flash_attn_with_kvcache
from flash_attn_cuda import kvcache as kvcache_module


def recorded(fn, module, name):
    """The (args, kwargs) with which one call of fn() calls module.name."""
    real, seen = getattr(module, name), []

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    setattr(module, name, spy)
    try:
        fn()
    finally:
        setattr(module, name, real)
    return seen[0] if seen else None


def layer_calls(x, cache_len):
    q, k_cache, v_cache, seqlens = x["q"], x["k_cache"], x["v_cache"], x["seqlens"]
    public = lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    calls = [
        ("torch.empty (one small op)", lambda: torch.empty(1, device="cuda")),
        ("kvcache", public),
        ("kvcache num_splits=1", lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                                 num_splits=1)),
        ("kvcache append+rotary causal",
         lambda: flash_attn_with_kvcache(q, k_cache, v_cache, x["new_k"], x["new_v"], rotary_cos=x["cos"],
                                         rotary_sin=x["sin"], cache_seqlens=seqlens - 1, causal=True)),
    ]
    chunks_args, _ = recorded(public, kvcache_module, "_chunks_attention")
    op = lambda: kvcache_module._chunks_attention(*chunks_args)
    calls.append(("  its kvcache_attention op", op))
    _, attention_kwargs = recorded(lambda: kvcache_module._chunks_attention_torch(*chunks_args), kvcache_module,
                                   "_attention")
    calls.append(("  its _attention", lambda: kvcache_module._attention(**attention_kwargs)))
    a = attention_kwargs
    window = a["window_size"]
    op_args = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"],
               a["q"].shape[-1] ** -0.5, a["causal"], window[0], window[1], a["softcap"], a["alibi_slopes"], False,
               0.0, True)
    ops = _extension.ops()
    calls.append(("  its fwd op", lambda: ops.fwd(*op_args)))

    def inference_op():
        with torch.inference_mode():
            ops.fwd(*op_args)

    calls.append(("  its fwd op in inference_mode", inference_op))
    merge = recorded(lambda: kvcache_module._chunks_attention_torch(*chunks_args), kvcache_module, "merge_splits")
    if merge is not None:
        calls.append(("  its merge_splits", lambda: kvcache_module.merge_splits(*merge[0], **merge[1])))
    keys, values = k_cache[:, :cache_len], v_cache[:, :cache_len]
    calls.append(("flash_attn_func on the keys", lambda: flash_attn_func(q, keys, values)))
    qt, kt, vt = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    calls.append(("sdpa (its own choice)", lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    calls.append(("sdpa cudnn (inside sdpa_kernel)", cudnn))
    return calls, public, op


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    for batch in (int(b) for b in args.batches.split(",")):
        x = make_inputs(batch, args.length, torch.bfloat16)
        calls, public, op = layer_calls(x, args.length)
        print(f"batch {batch}, {args.length} keys, GQA 32/8, d=128, bf16: us per call")
        for name, fn in calls:
            host, wall = per_call_us(fn, calls=1000)
            print(f"  {name:36s} host {host:7.1f}  wall {wall:7.1f}")
        if args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(500):
                public()
            profile.disable()
            torch.cuda.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        if args.trace:
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            print(profile_table(op, 200, activities, 30))


if __name__ == "__main__":
    main()
