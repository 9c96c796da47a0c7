"""Draws results/attn_h100.json as the paper's three figures (forward, backward, forward+backward):
two panels (non-causal, causal) per head dim in the file, TFLOPs/s per sequence length for
flash_attn_cuda and each SDPA backend measured in the same run.

python benchmarks/plot.py [--json PATH] [--dtype bf16] [--out DIR]
writes DIR/<json stem>_{fwd,bwd,fwd_bwd}.png (DIR: the json's folder; <json stem>_<dtype>_... for a
dtype other than bf16)
"""

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

from results_table import RESULTS  # noqa: E402

LABELS = {
    "flash_attn_cuda": "flash_attn_cuda (ours)",
    "flash_attn_cuda_sm80": "ours, FA2 family forced",
    "fa4": "FlashAttention-4",
    "sdpa_flash": "SDPA flash (FA2)",
    "sdpa_cudnn": "SDPA cuDNN",
    "sdpa_efficient": "SDPA efficient",
    "sdpa_math": "SDPA math",
}
COLORS = {"flash_attn_cuda": "#c0392b", "flash_attn_cuda_sm80": "#f1948a", "fa4": "#8e44ad",
          "sdpa_flash": "#2c7fb8", "sdpa_cudnn": "#7fcdbb", "sdpa_efficient": "#a6a6a6", "sdpa_math": "#525252"}
DIRECTIONS = {"fwd": "Forward", "bwd": "Backward", "fwd_bwd": "Forward + backward"}


def seqlen_label(n):
    return f"{n // 1024}k" if n >= 1024 else str(n)


def title(direction, dtype, meta):
    line = f"{DIRECTIONS[direction]} pass, {dtype}: flash_attn_cuda vs PyTorch SDPA"
    if meta:
        line += f", {meta['gpu']}\ntorch {meta['torch']}, commit {meta['commit']}, {meta['date']}"
        for later in meta.get("replaced_rows", []):  # rows re-measured later, in a run of their own
            line += f"\n{later['rows']}: commit {later['commit']}, {later['date']}"
    return line + "; batch = 16k tokens / seqlen, hidden 2048"


def draw_panel(ax, cells, seqlens):
    """Grouped bars: one group per seqlen, one bar per implementation; TFLOPs/s on our bars."""
    # The implementations this grid measured (an older grid has no FA4 or forced family).
    measured = {impl for impl, _ in cells}
    impls = [i for i in LABELS if i in measured]
    width = 0.84 / len(impls)
    for i, impl in enumerate(impls):
        xs = [x + (i - (len(impls) - 1) / 2) * width for x in range(len(seqlens))]
        ys = [cells.get((impl, n), 0) for n in seqlens]
        bars = ax.bar(xs, ys, width, color=COLORS[impl], label=LABELS[impl])
        if impl == "flash_attn_cuda":
            labels = [f"{cells[impl, n]:.0f}" if (impl, n) in cells else "" for n in seqlens]
            ax.bar_label(bars, labels, rotation=90, padding=3, fontsize=8, color=COLORS[impl])
        for x, n in zip(xs, seqlens):
            if (impl, n) not in cells:
                ax.text(x, 5, "not run", rotation=90, ha="center", va="bottom", fontsize=7, color="0.4")
    ax.set_xticks(range(len(seqlens)), [seqlen_label(n) for n in seqlens])
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot(rows, direction, dtype, meta, path):
    rows = [r for r in rows if r["direction"] == direction and r["dtype"] == dtype]
    seqlens = sorted({r["seqlen"] for r in rows})
    hdims = sorted({r["hdim"] for r in rows})
    fig, axes = plt.subplots(len(hdims), 2, figsize=(14, 4.2 * len(hdims) + 1), sharey=True,
                             squeeze=False, layout="constrained")
    for ax_row, hdim in zip(axes, hdims):
        for ax, causal in zip(ax_row, (False, True)):
            cells = {(r["impl"], r["seqlen"]): r["tflops"] for r in rows if r["hdim"] == hdim and r["causal"] == causal}
            draw_panel(ax, cells, seqlens)
            ax.set_title(f"head dim {hdim}, {'causal' if causal else 'non-causal'}")
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOPs/s")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length")
    axes[0, 0].set_ylim(top=axes[0, 0].get_ylim()[1] * 1.08)  # room for the labels on our bars
    fig.suptitle(title(direction, dtype, meta))
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=len(LABELS), frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=pathlib.Path, default=RESULTS / "attn_h100.json")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--out", type=pathlib.Path, help="output folder (default: the json's)")
    args = parser.parse_args()
    rows = json.loads(args.json.read_text())
    if not any(r["dtype"] == args.dtype for r in rows):
        parser.error(f"no {args.dtype} rows in {args.json}")
    meta_path = args.json.with_name(args.json.stem + "_meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    out = args.out or args.json.parent
    out.mkdir(parents=True, exist_ok=True)
    for direction in DIRECTIONS:
        if any(r["direction"] == direction for r in rows):
            name = direction if args.dtype == "bf16" else f"{args.dtype}_{direction}"
            path = out / f"{args.json.stem}_{name}.png"
            plot(rows, direction, args.dtype, meta, path)
            print(path)


if __name__ == "__main__":
    main()
