"""Variable-length attention: one batch of 16k tokens in sequences of mixed lengths (and, as a
control, of equal lengths), run packed through flash_attn_varlen_func and padded to the longest
sequence through flash_attn_func and PyTorch SDPA.

python benchmarks/benchmark_varlen.py [--json] [--hdims 64,128] [--causal false,true] ...

Implementations (each timed on inputs prepared beforehand, so padding and unpadding are not timed):
  flash_attn_cuda_varlen   the packed tokens, cu_seqlens
  flash_attn_cuda_varlen_sm80  the same with the FA2 family forced (FLASH_ATTN_CUDA_FAMILY=sm80)
  flash_attn_cuda_padded   flash_attn_func on the padded batch: the work of the padded layout (it
                           attends the padding too, so its non-causal output is not the varlen one)
  sdpa_flash_padded        the same with SDPA flash
  sdpa_<backend>_masked    SDPA on the padded batch with a boolean key padding mask (and the causal
                           one): the padded layout computed right; a backend that takes no mask is
                           recorded with its error as status
Directions: fwd, bwd (the backward of a stored forward), fwd_bwd.
Throughput is real tokens per second: the case's tokens (without padding) / time.
"""

import argparse
import importlib.util
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

import benchmark_attn
from benchmark_attn import DTYPES, HIDDEN, SDPA_BACKENDS, TOKENS, forced_sm80, metadata
from flash_attn_cuda import flash_attn_varlen_func
from flash_attn_cuda.bert_padding import unpad_input

DEVICE = "cuda"
IMPLS = {  # name: column label of the table
    "flash_attn_cuda_varlen": "varlen",
    "flash_attn_cuda_varlen_sm80": "var_sm80",
    "flash_attn_cuda_padded": "padded",
    "sdpa_flash_padded": "sdpa_pad",
    **{f"{backend}_masked": f"{backend[5:]}+mask" for backend in SDPA_BACKENDS},
}
MASKED = [impl for impl in IMPLS if impl.endswith("_masked")]


def mixed_lengths(total, max_len, seed):
    """Lengths drawn uniformly from [1, max_len] until they sum to total (the last one cut to fit)."""
    rng = random.Random(seed)
    lengths = []
    while (left := total - sum(lengths)) > 0:
        lengths.append(min(rng.randint(1, max_len), left))
    return lengths


def length_summary(lengths):
    return {"batch": len(lengths), "min": min(lengths), "max": max(lengths),
            "mean": round(statistics.mean(lengths), 1), "padded_tokens": len(lengths) * max(lengths)}


def make_inputs(lengths, nheads, head_dim, dtype):
    """Random q, k, v padded to (batch, max_len, nheads, head_dim), and what the other layouts need:
    the packed tokens, cu_seqlens and the (batch, max_len) mask of real tokens."""
    valid = torch.arange(max(lengths), device=DEVICE) < torch.tensor(lengths, device=DEVICE)[:, None]
    padded = [torch.randn(*valid.shape, nheads, head_dim, device=DEVICE, dtype=dtype) for _ in range(3)]
    unpadded = [unpad_input(t, valid) for t in padded]
    return {"padded": padded, "packed": [u[0] for u in unpadded], "cu_seqlens": unpadded[0][2], "valid": valid}


def attention_fn(impl, causal, inputs):
    """impl's attention as f(q, k, v) on its layout: packed (total, nheads, d) for varlen, else
    padded (batch, max_len, nheads, d)."""
    if impl.startswith("flash_attn_cuda_varlen"):
        cu_seqlens, max_len = inputs["cu_seqlens"], inputs["valid"].shape[1]
        return lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len,
                                                      causal=causal)
    if impl.endswith("_padded"):  # flash_attn_cuda or sdpa_flash, as benchmark_attn runs them
        return benchmark_attn.attention_fn(impl.removesuffix("_padded"), causal)
    valid = inputs["valid"]
    mask = valid[:, None, None, :]  # (batch, 1 head, 1 query, key): no query sees a padded key
    if causal:  # right padding leaves every row a key, so no row is fully masked
        mask = mask & torch.ones(valid.shape[1], valid.shape[1], dtype=torch.bool, device=DEVICE).tril()
    backend = SDPA_BACKENDS[impl.removesuffix("_masked")]

    def sdpa(q, k, v):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 attn_mask=mask)
        return out.transpose(1, 2)

    return sdpa


def make_call(attend, q, k, v, direction):
    """A no-argument function running fwd, bwd or fwd_bwd."""
    if direction == "fwd":
        return lambda: attend(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    if direction == "bwd":
        out = attend(q, k, v)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), dout)


def time_ms(fn):
    """Median milliseconds: triton's do_bench as benchmark_attn uses it (after SETTLE_MS of fn), else
    CUDA events (after the same)."""
    if importlib.util.find_spec("triton"):
        return benchmark_attn.time_ms(fn)
    benchmark_attn.settle_on(fn)
    for _ in range(10):
        fn()
    times = []
    for _ in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(impl, inputs, causal, direction):
    """(ms, "ok"), or (None, the first line of the error)."""
    q, k, v = inputs["packed" if impl.startswith("flash_attn_cuda_varlen") else "padded"]
    try:
        if impl.endswith("_sm80"):
            call = forced_sm80(make_call, attention_fn(impl, causal, inputs), q, k, v, direction)
            return time_ms(lambda: forced_sm80(call)), "ok"
        return time_ms(make_call(attention_fn(impl, causal, inputs), q, k, v, direction)), "ok"
    except (RuntimeError, torch.OutOfMemoryError) as err:
        return None, str(err).strip().splitlines()[0][:120]
    finally:
        torch.cuda.empty_cache()


def print_table(rows):
    """Millions of real tokens per second per implementation, then varlen's ratio to itself with the
    FA2 family forced, to the padded flash_attn_cuda and to the fastest SDPA with a mask."""
    cells = {}
    for r in rows:
        if r["tokens_per_s"]:
            cells.setdefault((r["case"], r["direction"], r["hdim"], r["causal"]), {})[r["impl"]] = r["tokens_per_s"]
    impls = [i for i in IMPLS if any(i in t for t in cells.values())]
    widths = [max(len(IMPLS[i]), 6) for i in impls]
    print("M tokens/s (real tokens); x: flash_attn_cuda_varlen's ratio")
    print(f"{'case':6} {'dir':7} {'d':>4} {'causal':6} "
          + " ".join(f"{IMPLS[i]:>{w}}" for i, w in zip(impls, widths)) + f" {'x sm80':>6} {'x padded':>8}"
          + "  x best sdpa+mask")
    for (case, direction, hdim, causal), t in cells.items():
        values = " ".join(f"{t[i] / 1e6:{w}.2f}" if i in t else f"{'-':>{w}}" for i, w in zip(impls, widths))
        ours, padded = t.get("flash_attn_cuda_varlen"), t.get("flash_attn_cuda_padded")
        sm80 = t.get("flash_attn_cuda_varlen_sm80")
        x_sm80 = f"{ours / sm80:6.2f}" if ours and sm80 else f"{'-':>6}"
        best = max((i for i in MASKED if i in t), key=t.get, default=None)
        x_padded = f"{ours / padded:8.2f}" if ours and padded else f"{'-':>8}"
        x_best = f"{ours / t[best]:6.2f} ({IMPLS[best]})" if ours and best else f"{'-':>6}"
        print(f"{case:6} {direction:7} {hdim:4d} {str(causal):6} {values} {x_sm80} {x_padded}  {x_best}")


def save(rows, meta):
    benchmark_attn.write_result("varlen_h100.json", rows)
    benchmark_attn.write_result("varlen_h100_meta.json", meta)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="mixed,equal")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="real tokens per batch")
    parser.add_argument("--max-len", type=int, default=4096, help="longest sequence of the mixed case")
    parser.add_argument("--equal-len", type=int, default=2048, help="sequence length of the equal case")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mixed lengths")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--hdims", default="64,128", help=f"nheads = {HIDDEN} / hdim")
    parser.add_argument("--causal", default="false,true")
    parser.add_argument("--directions", default="fwd,fwd_bwd")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--json", action="store_true", help="write results/varlen_h100.json and its _meta.json")
    args = parser.parse_args()

    all_cases = {"mixed": mixed_lengths(args.tokens, args.max_len, args.seed),
                 "equal": [args.equal_len] * (args.tokens // args.equal_len)}
    cases = {name: all_cases[name] for name in args.cases.split(",")}
    causals = [c.strip().lower() == "true" for c in args.causal.split(",")]
    meta = {**metadata(), "seed": args.seed, "lengths": cases}
    print(meta)
    start = time.perf_counter()
    rows = []
    for case, lengths in cases.items():
        for hdim in (int(h) for h in args.hdims.split(",")):
            inputs = make_inputs(lengths, HIDDEN // hdim, hdim, DTYPES[args.dtype])
            for causal in causals:
                for direction in args.directions.split(","):
                    for impl in args.impls.split(","):
                        ms, status = bench(impl, inputs, causal, direction)
                        rows.append(dict(case=case, impl=impl, direction=direction, dtype=args.dtype, hdim=hdim,
                                         nheads=HIDDEN // hdim, causal=causal, total_tokens=sum(lengths),
                                         lengths=length_summary(lengths), ms=ms,
                                         tokens_per_s=sum(lengths) / ms * 1e3 if ms else None, status=status))
                        if status != "ok":
                            print(f"  {case} {direction} {impl} d={hdim} causal={causal}: {status}")
                        if args.json:  # after every row, so that a run cut short keeps what it measured
                            save(rows, meta)
    print(f"{time.perf_counter() - start:.0f} s")
    print_table(rows)


if __name__ == "__main__":
    main()
