"""End-to-end GPT training throughput (the paper's section 4.3): GPT-3 shapes 125M / 350M / 760M /
1.3B at context 2k and 8k, with attention by flash_attn_cuda or by one SDPA backend, nothing else
changed. Synthetic random tokens, bf16 autocast, fused AdamW; a step is forward + backward +
optimizer step.

TFLOPs/s per GPU use the paper's formula, per token 6 * params + 12 * layers * hidden * seqlen
(flash_attn_cuda.models.flops_per_token), with params = all parameters: the tied token embedding
counted once (its 6 * vocab * hidden per token is the LM head GEMM) and the position table
included (no GEMM: it overcounts by 6 * max_seqlen * hidden, under 1%). MFU is against the bf16
8192^3 GEMM measured in the same run.

python benchmarks/benchmark_gpt.py [--quick] [--json] [--models 125M,1.3B] [--seqlens 2048]
    [--impls flash_attn_cuda,sdpa_flash] [--steps 10] [--warmup 3]
torchrun --nproc_per_node=2 benchmarks/benchmark_gpt.py --dist fsdp --models 1.3B ...
    (same per-GPU micro-batch on every rank; tokens/s are per GPU; an OOM on one rank leaves the
    others waiting in a collective, so leave sdpa_math out there)
"""

import argparse
import dataclasses
import datetime
import gc
import json
import os
import pathlib
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from flash_attn_cuda.models import GPT, GPT3_CONFIGS, GPTConfig, flops_per_token
from flash_attn_cuda.modules import IMPLS as ALL_IMPLS

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODELS = {**GPT3_CONFIGS, "tiny": GPTConfig(n_layers=2, hidden=128, n_heads=2)}  # tiny: smoke tests only
IMPLS = ["flash_attn_cuda", "sdpa_flash", "sdpa_cudnn", "sdpa_math"]
QUICK = dict(models="125M", seqlens="2048,8192", steps=2, warmup=1)
DEFAULTS = dict(models=",".join(GPT3_CONFIGS), seqlens="2048,8192", steps=10, warmup=3)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_tflops(device, n, reps=20):
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def init_distributed(device_kind):
    """(rank, world_size, device): torchrun's process group, or a single process without one."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, torch.device(device_kind)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    device = torch.device(device_kind, local_rank) if device_kind == "cuda" else torch.device("cpu")
    return dist.get_rank(), world_size, device


def wrap(model, mode, device):
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)  # the root: embeddings (tied to the LM head) and the final norm
    return model


def train_step(model, optimizer, inputs, targets):
    """One forward + backward + optimizer step under bf16 autocast; returns the loss (not synced)."""
    with torch.autocast(inputs.device.type, dtype=torch.bfloat16):
        logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def measure(config, impl, batch, seqlen, steps, warmup, device, dist_mode):
    """(seconds per step, params, peak GiB). Raises torch.OutOfMemoryError when it does not fit."""
    torch.manual_seed(0)  # the same init on every rank, as fully_shard expects
    with device:
        model = GPT(config, impl)
    params = model.num_params()
    if dist_mode:
        model = wrap(model, dist_mode, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
    tokens = torch.randint(config.vocab_size, (batch, seqlen + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    for _ in range(warmup):
        train_step(model, optimizer, inputs, targets)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(model, optimizer, inputs, targets)
    synchronize(device)
    seconds = (time.perf_counter() - start) / steps
    if not torch.isfinite(loss).item():
        raise FloatingPointError(f"loss is {loss.item()}")
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, params, peak


def bench_row(name, seqlen, impl, args, device, gemm, world_size):
    config = dataclasses.replace(MODELS[name], max_seqlen=seqlen)
    batch = max(1, args.tokens_per_step // seqlen)
    row = dict(model=name, seqlen=seqlen, impl=impl, batch=batch, world_size=world_size, dist=args.dist,
               gemm_tflops=gemm, status="ok",
               tokens_per_s=None, tflops_per_gpu=None, mfu=None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        seconds, params, peak = measure(config, impl, batch, seqlen, args.steps, args.warmup, device, args.dist)
    except torch.OutOfMemoryError:
        row.update(status="skipped", reason="oom")
    except (RuntimeError, FloatingPointError) as err:  # e.g. SDPA: no kernel for these inputs
        row.update(status="error", reason=str(err).strip().splitlines()[0][:160])
    # Outside the except blocks, so that the traceback's frames (holding the model) are gone.
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if row["status"] != "ok":
        return row
    tokens_per_s = batch * seqlen / seconds
    tflops = tokens_per_s * flops_per_token(params, config.n_layers, config.hidden, seqlen) / 1e12
    row.update(tokens_per_s=tokens_per_s, tflops_per_gpu=tflops, mfu=tflops / gemm, step_ms=seconds * 1e3,
               params=params, head_dim=config.head_dim, peak_mem_gib=peak)
    return row


def progress(items, enabled):
    """tqdm over items when it is installed, else one line per item on stderr."""
    if not enabled:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return _lines(items)
    return tqdm(items, file=sys.stderr, desc="gpt", dynamic_ncols=True)


def _lines(items):
    start = time.perf_counter()
    for i, item in enumerate(items):
        print(f"[{i + 1}/{len(items)}, {time.perf_counter() - start:.0f} s] {' '.join(map(str, item))}",
              file=sys.stderr, flush=True)
        yield item


def describe(row):
    head = f"{row['model']:>5} seqlen {row['seqlen']:5d} batch {row['batch']:2d} {row['impl']:15}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row['reason']}"
    peak = f", peak {row['peak_mem_gib']:.1f} GiB" if row["peak_mem_gib"] is not None else ""
    return (f"{head} {row['tokens_per_s']:9.0f} tok/s {row['tflops_per_gpu']:6.1f} TFLOPs/s "
            f"MFU {row['mfu']:.2f} ({row['step_ms']:.0f} ms/step{peak})")


def print_table(rows, impls):
    """TFLOPs/s per GPU per impl (or why there is none), flash_attn_cuda's MFU, and its ratio to
    each other impl, per (model, seqlen)."""
    cells = {}
    for r in rows:
        cells.setdefault((r["model"], r["seqlen"]), {})[r["impl"]] = r
    others = [i for i in impls if i != "flash_attn_cuda"]
    print("\nTFLOPs/s per GPU; MFU of flash_attn_cuda against the measured bf16 GEMM; x: ours / theirs")
    print(f"{'model':>5} {'seqlen':>6} " + " ".join(f"{i:>15}" for i in impls) + f" {'MFU':>5} "
          + " ".join(f"{'x ' + i.removeprefix('sdpa_'):>11}" for i in others))
    for (model, seqlen), by_impl in sorted(cells.items(), key=lambda kv: (list(MODELS).index(kv[0][0]), kv[0][1])):
        tflops = {i: r["tflops_per_gpu"] for i, r in by_impl.items() if r["status"] == "ok"}
        shown = [f"{tflops[i]:.1f}" if i in tflops else by_impl[i]["reason"][:15] if i in by_impl else "-"
                 for i in impls]
        ours = tflops.get("flash_attn_cuda")
        mfu = f"{by_impl['flash_attn_cuda']['mfu']:.2f}" if ours else "-"
        ratios = [f"{ours / tflops[i]:.2f}" if ours and i in tflops else "-" for i in others]
        print(f"{model:>5} {seqlen:6d} " + " ".join(f"{c:>15}" for c in shown) + f" {mfu:>5} "
              + " ".join(f"{x:>11}" for x in ratios))


def run_metadata(device):
    """Date, device, torch and commit (FLASH_ATTN_COMMIT, for a tree copied without .git)."""
    commit = os.environ.get("FLASH_ATTN_COMMIT")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return dict(date=datetime.date.today().isoformat(), gpu=gpu, torch=torch.__version__, commit=commit)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)} (default: the four GPT-3 shapes)")
    parser.add_argument("--seqlens", help="comma-separated context lengths (default 2048,8192)")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated, of {', '.join(ALL_IMPLS)}")
    parser.add_argument("--steps", type=int, help="timed steps per row (default 10)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 3)")
    parser.add_argument("--tokens-per-step", type=int, default=16384,
                        help="micro-batch = this / seqlen sequences per GPU (default 16384)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 125M, 2k and 8k, 1 warm-up + 2 timed steps (flags given still win)")
    parser.add_argument("--json", action="store_true", help="write the rows to --out and a _meta.json beside it")
    parser.add_argument("--out", type=pathlib.Path,
                        help="default results/gpt_h100.json, or results/gpt_<N>gpu_<dist>.json under torchrun")
    parser.add_argument("--dist", choices=["fsdp", "ddp"], default="fsdp", help="under torchrun (default fsdp)")
    parser.add_argument("--device", default="cuda", help="cpu runs the tiny model for smoke tests")
    parser.add_argument("--gemm-size", type=int,
                        help="n of the n x n x n bf16 GEMM that MFU is measured against (default 8192; 512 on cpu)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.models = args.models.split(",")
    args.seqlens = [int(s) for s in args.seqlens.split(",")]
    args.impls = args.impls.split(",")
    if args.gemm_size is None:
        args.gemm_size = 8192 if args.device == "cuda" else 512
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    for name in args.models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    for impl in args.impls:
        if impl not in ALL_IMPLS:
            parser.error(f"unknown impl {impl!r}; expected one of {', '.join(ALL_IMPLS)}")
    return args


def main():
    args = parse_args()
    rank, world_size, device = init_distributed(args.device)
    if world_size == 1:
        args.dist = None
    out = args.out or RESULTS / ("gpt_h100.json" if world_size == 1 else f"gpt_{world_size}gpu_{args.dist}.json")
    gemm = gemm_tflops(device, args.gemm_size)
    meta = dict(run_metadata(device), world_size=world_size, dist=args.dist, gemm_tflops=gemm,
                tokens_per_step=args.tokens_per_step, steps=args.steps, warmup=args.warmup)
    if rank == 0:
        print(meta)
    configs = [(m, s, i) for m in args.models for s in args.seqlens for i in args.impls]
    rows = []
    for name, seqlen, impl in progress(configs, enabled=rank == 0):
        rows.append(bench_row(name, seqlen, impl, args, device, gemm, world_size))
        if rank == 0:
            print(describe(rows[-1]), flush=True)
            if args.json:  # after every row, so that a run cut short keeps what it measured
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(rows, indent=1) + "\n")
                out.with_name(out.stem + "_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    if rank == 0:
        print_table(rows, args.impls)
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
