"""Prints results/attn_h100.json as the markdown table of RESULTS.md (TFLOPs/s and our ratio to
each SDPA backend, measured in the same run)."""

import argparse
import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SDPA = ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=pathlib.Path, default=RESULTS / "attn_h100.json")
    parser.add_argument("--direction", default="fwd")
    args = parser.parse_args()
    cells = {}
    for row in json.loads(args.json.read_text()):
        if row["direction"] == args.direction:
            key = (row["dtype"], row["hdim"], row["causal"], row["seqlen"])
            cells.setdefault(key, {})[row["impl"]] = row["tflops"]
    print("| dtype | d | causal | seqlen | ours | " + " | ".join(s[5:] for s in SDPA) + " | "
          + " | ".join(f"x {s[5:]}" for s in SDPA) + " |")
    print("|" + "---|" * (5 + 2 * len(SDPA)))
    for (dtype, hdim, causal, seqlen), t in sorted(cells.items()):
        ours = t.get("flash_attn_cuda")
        values = [f"{t[s]:.0f}" if s in t else "-" for s in SDPA]
        ratios = [f"{ours / t[s]:.2f}" if ours and s in t else "-" for s in SDPA]
        print(f"| {dtype} | {hdim} | {causal} | {seqlen} | {ours:.0f} | " + " | ".join(values) + " | "
              + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
