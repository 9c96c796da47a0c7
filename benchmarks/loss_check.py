"""Loss curves of a small GPT (4 layers, hidden 256, head dim 64, context 256, byte-level) trained
on benchmarks/synthetic_text.py's corpus with flash_attn_cuda's attention and with SDPA's, from
the same init on the same batches. They should agree within the noise that separates two correct
attention implementations; sdpa_math vs sdpa_flash is run as that yardstick.

python benchmarks/loss_check.py            # ~1 min on an H100: results/loss_h100.json (+ .png)
python benchmarks/loss_check.py --plot-only  # the PNG from the JSON (needs matplotlib)
"""

import argparse
import json
import math
import pathlib
import time

import torch

from benchmark_gpt import run_metadata, train_step
from flash_attn_cuda.models import GPT, GPTConfig
from synthetic_text import corpus

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CONFIG = GPTConfig(n_layers=4, hidden=256, n_heads=4, vocab_size=256, max_seqlen=256)
BASELINE = "sdpa_flash"


def lr_factor(step, warmup, steps):
    """Linear warm-up, then cosine decay to 10%."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def train(impl, init_state, data, offsets, args, device):
    """The loss of every step, training a model with impl's attention from init_state."""
    model = GPT(CONFIG, impl)
    model.load_state_dict(init_state)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.warmup, args.steps))
    window = torch.arange(CONFIG.max_seqlen + 1, device=device)
    losses = []
    for step_offsets in offsets.to(device):
        tokens = data[step_offsets[:, None] + window]
        losses.append(train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:]).detach())
        schedule.step()
    return [round(x, 5) for x in torch.stack(losses).tolist()]


def smooth(values, window):
    """Trailing moving average over full windows (len(values) - window + 1 points)."""
    return torch.tensor(values).unfold(0, window, 1).mean(dim=1)


def summarize(losses, window):
    """Final loss (mean of the last window steps) per impl, and each impl's max |difference| from
    the baseline's smoothed curve."""
    summary = {"final_loss": {impl: sum(v[-window:]) / window for impl, v in losses.items()}}
    if BASELINE in losses:
        base = smooth(losses[BASELINE], window)
        summary[f"max_abs_diff_smoothed_vs_{BASELINE}"] = {
            impl: (smooth(v, window) - base).abs().max().item() for impl, v in losses.items() if impl != BASELINE}
    return summary


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window, steps = result["meta"]["smooth"], result["step"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(3, 1))
    for impl, losses in result["loss"].items():
        line, = top.plot(steps, losses, alpha=0.25, linewidth=0.8)
        top.plot(steps[window - 1:], smooth(losses, window), color=line.get_color(), label=impl)
        if impl != BASELINE and BASELINE in result["loss"]:
            diff = smooth(losses, window) - smooth(result["loss"][BASELINE], window)
            bottom.plot(steps[window - 1:], diff, color=line.get_color(), label=f"{impl} - {BASELINE}")
    meta = result["meta"]
    top.set(ylabel="training loss (nats/byte)",
            title=f"Same init, same batches ({meta['gpu']}, torch {meta['torch']})\nGPT: {meta['model']}")
    top.legend()
    bottom.axhline(0, color="gray", linewidth=0.5)
    bottom.set(xlabel="step", ylabel=f"difference ({window}-step mean)")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def report(result):
    for key, values in result["summary"].items():
        print(key + ": " + ", ".join(f"{impl} {value:.4f}" for impl, value in values.items()))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default=f"flash_attn_cuda,{BASELINE},sdpa_math")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--smooth", type=int, default=25, help="moving-average window for the comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "loss_h100.json")
    parser.add_argument("--plot-only", action="store_true", help="only make the PNG from --out")
    return parser.parse_args()


def main():
    args = parse_args()
    png = args.out.with_suffix(".png")
    if args.plot_only:
        result = json.loads(args.out.read_text())
        report(result)
        plot(result, png)
        return
    device = torch.device(args.device)
    data = torch.frombuffer(bytearray(corpus(args.seed, 4 << 20)), dtype=torch.uint8).to(device, torch.int64)
    batch_rng = torch.Generator().manual_seed(args.seed + 1)
    offsets = torch.randint(len(data) - CONFIG.max_seqlen - 1, (args.steps, args.batch), generator=batch_rng)
    torch.manual_seed(args.seed)
    init_state = GPT(CONFIG, "sdpa_math").state_dict()
    losses = {}
    for impl in args.impls.split(","):
        start = time.perf_counter()
        losses[impl] = train(impl, init_state, data, offsets, args, device)
        print(f"{impl}: {time.perf_counter() - start:.1f} s, loss {losses[impl][0]:.3f} -> {losses[impl][-1]:.3f}")
    meta = dict(run_metadata(device), model="4 layers, hidden 256, 4 heads (d=64), context 256, vocab 256",
                **{k: v for k, v in vars(args).items() if k not in ("out", "plot_only", "device")})
    result = dict(meta=meta, step=list(range(1, args.steps + 1)), loss=losses,
                  summary=summarize(losses, args.smooth))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    report(result)
    try:
        plot(result, png)
    except ImportError:
        print("matplotlib is not installed: make the PNG elsewhere with --plot-only")


if __name__ == "__main__":
    main()
