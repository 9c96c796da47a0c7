"""Attention throughput on the paper's grid (section 4.1): flash_attn_cuda (the best family, and the
FA2 family forced) vs PyTorch SDPA's flash, cuDNN, efficient and math backends and FlashAttention-4
(the flash-attn-4 package, where importable), measured in one process.

python benchmarks/benchmark_attn.py [--quick] [--json] [--memory] [--dtypes bf16,fp16]
    [--directions fwd,bwd,fwd_bwd] ...
--impls also takes flash_attn_cuda_det and flash_attn_cuda_sm80_det (deterministic=True), which
the default list leaves out.
"""

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn_cuda import flash_attn_func
from gpu_clocks import ClockSampler

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}
IMPLS = ["flash_attn_cuda", "flash_attn_cuda_sm80", *SDPA_BACKENDS, "fa4"]
# Named with --impls only: ours with deterministic=True (dq accumulated in a fixed order), on the
# family the default picks and with the FA2 family forced.
DETERMINISTIC_IMPLS = ["flash_attn_cuda_det", "flash_attn_cuda_sm80_det"]
# Column labels of the printed table.
LABELS = {"flash_attn_cuda_sm80": "sm80", "fa4": "fa4", "flash_attn_cuda_det": "det",
          "flash_attn_cuda_sm80_det": "sm80_det", **{name: name[5:] for name in SDPA_BACKENDS}}
TOKENS = 16384
HIDDEN = 2048


def attention_flops(seqlen, head_dim, nheads, batch, causal, direction):
    fwd = 4 * seqlen * seqlen * head_dim * nheads * batch / (2 if causal else 1)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd_bwd": 3.5 * fwd}[direction]


def attention_fn(impl, causal):
    """impl's attention as f(q, k, v) in our (batch, seqlen, nheads, d) layout."""
    if impl in ("flash_attn_cuda", "flash_attn_cuda_det"):
        deterministic = impl == "flash_attn_cuda_det"
        return lambda q, k, v: flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    if impl in ("flash_attn_cuda_sm80", "flash_attn_cuda_sm80_det"):
        return lambda q, k, v: forced_sm80(attention_fn(impl.replace("_sm80", ""), causal), q, k, v)
    if impl == "fa4":
        from flash_attn.cute import flash_attn_func as fa4_func

        def fa4(q, k, v):
            out = fa4_func(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out

        return fa4
    backend = SDPA_BACKENDS[impl]

    def sdpa(q, k, v):
        with sdpa_kernel(backend):  # SDPA takes (batch, nheads, seqlen, d)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal)
        return out.transpose(1, 2)

    return sdpa


def forced_sm80(fn, *args, **kwargs):
    """fn with the FA2 family forced (FLASH_ATTN_CUDA_FAMILY=sm80, read at each call)."""
    os.environ["FLASH_ATTN_CUDA_FAMILY"] = "sm80"
    try:
        return fn(*args, **kwargs)
    finally:
        del os.environ["FLASH_ATTN_CUDA_FAMILY"]


def available_impls():
    """IMPLS less fa4 where flash-attn-4 cannot be imported."""
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError:
        return [i for i in IMPLS if i != "fa4"]
    return IMPLS


def make_call(impl, q, k, v, causal, direction):
    """A no-argument function running one direction: fwd, bwd (the backward of a stored forward),
    or fwd_bwd. flash_attn_cuda_sm80(_det) runs every direction with the FA2 family forced."""
    if impl in ("flash_attn_cuda_sm80", "flash_attn_cuda_sm80_det"):
        call = forced_sm80(make_call, impl.replace("_sm80", ""), q, k, v, causal, direction)
        return lambda: forced_sm80(call)
    attend = attention_fn(impl, causal)
    if direction == "fwd":
        return lambda: attend(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    if direction == "bwd":
        out = attend(q, k, v)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), dout)


# The GPU's speed after a change of load takes longer to settle than do_bench's 25 ms warm-up: the
# first impl timed after a 16k cell ran up to 16% slow at 1k, and with only that one settled, the
# impl timed after it ran 5-11% below its recorded speed at 8k-16k (benchmarks/NOTES.md, runs
# 329-331). So every timing runs its own call this long first, whatever ran before it.
SETTLE_MS = 500


def settle_on(fn):
    end = time.perf_counter() + SETTLE_MS / 1000
    while time.perf_counter() < end:
        fn()
        torch.cuda.synchronize()


def time_ms(fn):
    from triton.testing import do_bench

    settle_on(fn)
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def grid_inputs(seqlen, head_dim, dtype=torch.bfloat16):
    """Random q, k, v of one cell of the grid: batch TOKENS // seqlen, HIDDEN // head_dim heads."""
    shape = (TOKENS // seqlen, seqlen, HIDDEN // head_dim, head_dim)
    return tuple(torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))


def add_shape_arguments(parser, seqlen):
    """--seqlen (default seqlen), --head-dim and --causal: one cell of the grid, for the tools that
    look at a single shape."""
    parser.add_argument("--seqlen", type=int, default=seqlen)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")


def bench_config(impl, dtype, head_dim, causal, seqlen, direction, skip_math_above):
    if impl == "sdpa_math" and seqlen > skip_math_above:
        return None, f"skipped above seqlen {skip_math_above}"
    q, k, v = grid_inputs(seqlen, head_dim, DTYPES[dtype])
    batch, _, nheads, _ = q.shape
    try:
        ms = time_ms(make_call(impl, q, k, v, causal, direction))
    except (RuntimeError, torch.OutOfMemoryError) as err:
        return None, str(err).splitlines()[0][:100]
    finally:
        torch.cuda.empty_cache()
    flops = attention_flops(seqlen, head_dim, nheads, batch, causal, direction)
    row = dict(impl=impl, direction=direction, dtype=dtype, hdim=head_dim, causal=causal, seqlen=seqlen,
               batch=batch, nheads=nheads, ms=ms, tflops=flops / ms * 1e-9)
    return row, None


def peak_memory(impl, direction, seqlen=16384, head_dim=128, nheads=16):
    """Memory allocated beyond the inputs by one call (fwd), or by the backward of a stored
    forward (bwd), at batch 1."""
    q, k, v = (torch.randn(1, seqlen, nheads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    try:
        call = make_call(impl, q, k, v, False, direction)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
    except (RuntimeError, torch.OutOfMemoryError) as err:
        return {"impl": impl, "direction": direction, "error": str(err).splitlines()[0][:100]}
    finally:
        torch.cuda.empty_cache()
    return {"impl": impl, "direction": direction, "seqlen": seqlen, "hdim": head_dim, "nheads": nheads,
            "peak_extra_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}


def attn_cell(r):
    return (r["direction"], r["dtype"], f"d={r['hdim']}", f"causal={r['causal']}", f"seqlen={r['seqlen']}")


def attn_speeds(rows):
    """{(cell, impl): TFLOPs/s} of the grid's rows, for against_record."""
    return {(attn_cell(r), r["impl"]): r["tflops"] for r in rows}


def recorded_speeds(path, speeds):
    """speeds(the file's JSON) of a results file as it was before this run (a --json run rewrites it
    row by row); {} where there is none, or a killed run left it cut short."""
    try:
        return speeds(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return {}


def against_record(now, recorded, peers, ours="flash_attn_cuda", drop=0.05, peer_cell=lambda cell: cell):
    """now, recorded: {(cell, impl): speed}, cell a tuple naming the problem, speed the higher the
    faster. Lines naming each cell where ours fell more than `drop` below its record, taken
    relative to the change of the first of `peers` measured in both at peer_cell(cell) (so that a
    slower machine or clock is not reported as ours); without such a peer, the bare change."""
    lines = []
    for (cell, impl), speed in sorted(now.items()):
        if impl != ours or (cell, impl) not in recorded:
            continue
        at = peer_cell(cell)
        machine = next((now[at, p] / recorded[at, p] for p in peers if (at, p) in now and (at, p) in recorded), None)
        change = speed / recorded[cell, impl] / (machine or 1.0)
        if change < 1 - drop:
            peer = f"the peer {machine:.2f}x its own" if machine else "no peer measured in both runs"
            lines.append(f"record: {' '.join(map(str, cell))}: ours {change:.2f}x its recorded speed ({peer})")
    return lines


def print_table(rows):
    by_key = {}
    for r in rows:
        key = (r["direction"], r["dtype"], r["hdim"], r["causal"], r["seqlen"])
        by_key.setdefault(key, {})[r["impl"]] = r["tflops"]
    others = [i for i in IMPLS + DETERMINISTIC_IMPLS if i != "flash_attn_cuda" and any(i in t for t in by_key.values())]
    print(f"{'dir':7} {'dtype':5} {'d':>4} {'causal':6} {'seqlen':>6} {'ours':>7} "
          + " ".join(f"{LABELS[i]:>9}" for i in others) + "  " + " ".join(f"{'x' + LABELS[i]:>9}" for i in others))
    for (direction, dtype, hdim, causal, seqlen), t in sorted(by_key.items()):
        ours = t.get("flash_attn_cuda")
        cells = " ".join(f"{t[i]:9.1f}" if i in t else f"{'-':>9}" for i in others)
        ratios = " ".join(f"{ours / t[i]:9.2f}" if ours and i in t else f"{'-':>9}" for i in others)
        print(f"{direction:7} {dtype:5} {hdim:4d} {str(causal):6} {seqlen:6d} {ours or 0:7.1f} {cells}  {ratios}")


def write_result(name, data):
    """results/<name>: data as indented JSON, as every benchmark writes its results."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text(json.dumps(data, indent=1) + "\n")


def save(rows, meta):
    write_result("attn_h100.json", rows)
    write_result("attn_h100_meta.json", meta)


def metadata():
    """Date, GPU, torch and commit (FLASH_ATTN_COMMIT, for a tree copied without .git)."""
    commit = os.environ.get("FLASH_ATTN_COMMIT")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "commit": commit}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--hdims", default="64,128,256")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--causal", default="false,true")
    parser.add_argument("--directions", default="fwd,bwd,fwd_bwd")
    parser.add_argument("--impls", default=",".join(available_impls()))
    parser.add_argument("--skip-math-above", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="a smoke subset: seqlen 2k and 16k")
    parser.add_argument("--json", action="store_true", help="write results/attn_h100.json and its _meta.json")
    parser.add_argument("--memory", action="store_true", help="peak memory of one forward and of one backward at seqlen 16k")
    args = parser.parse_args()

    seqlens = [2048, 16384] if args.quick else [int(s) for s in args.seqlens.split(",")]
    causals = [c.strip().lower() == "true" for c in args.causal.split(",")]
    meta = metadata()
    print(meta)
    recorded = recorded_speeds(RESULTS / "attn_h100.json", attn_speeds)
    rows = []
    cells = [(direction, dtype, hdim, causal, seqlen, impl) for direction in args.directions.split(",")
             for dtype in args.dtypes.split(",") for hdim in (int(h) for h in args.hdims.split(","))
             for causal in causals for seqlen in seqlens for impl in args.impls.split(",")]
    start = time.time()
    with ClockSampler() as clocks:
        for n, (direction, dtype, hdim, causal, seqlen, impl) in enumerate(cells, 1):
            row, why = bench_config(impl, dtype, hdim, causal, seqlen, direction, args.skip_math_above)
            label = f"{direction} {impl} {dtype} d={hdim} causal={causal} seqlen={seqlen}"
            if row:
                rows.append(row)
                if args.json:  # after every row, so that a run cut short keeps what it measured
                    save(rows, meta)
                print(f"[{n}/{len(cells)} {time.time() - start:.0f}s] {label}: {row['tflops']:.1f} TFLOPs/s")
            else:
                print(f"[{n}/{len(cells)} {time.time() - start:.0f}s] {label}: {why}")
    meta["clocks"] = clocks.summary
    print("clocks:", clocks.summary)
    if args.memory:
        meta["peak_memory"] = [peak_memory(i, d) for d in ("fwd", "bwd") for i in ("flash_attn_cuda", "sdpa_flash",
                                                                                   "sdpa_math")]
        for m in meta["peak_memory"]:
            print("peak memory:", m)
    if args.json:
        save(rows, meta)
    print_table(rows)
    for line in against_record(attn_speeds(rows), recorded, ["sdpa_flash"]):
        print(line)


if __name__ == "__main__":
    main()
