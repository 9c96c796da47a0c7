"""A/B of two package trees on one GPU: benchmark_attn.py run in alternated processes, one per tree
and round, the order reversed every other round (so that neither tree always runs after the
other), then per cell and round the second tree's time over the first's, for ours and for the
first peer measured (the control: the same kernel in both trees, so its ratio is the noise).

python benchmarks/ab_trees.py TREE_A TREE_B [--rounds 2] [benchmark_attn.py arguments]
    e.g. ab/ref . --rounds 3 --directions fwd --hdims 128 --impls flash_attn_cuda,sdpa_cudnn

A tree is a folder holding the flash_attn_cuda package with its built module (a checkout, or an
older commit's package with its module, built on the CPU machine and carried); it goes first on
PYTHONPATH of its processes. This file's benchmark_attn.py times both trees.
"""

import argparse
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parent / "benchmark_attn.py"


def table_rows(output):
    """{(direction, dtype, hdim, causal, seqlen): (ours, first peer or None)} TFLOPs/s from the
    table benchmark_attn.py prints last."""
    rows = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[0] not in ("fwd", "bwd", "fwd_bwd"):
            continue
        try:
            cell = (fields[0], fields[1], int(fields[2]), fields[3], int(fields[4]))
            ours = float(fields[5])
            peer = float(fields[6]) if len(fields) > 6 and fields[6] != "-" else None
        except ValueError:
            continue
        rows[cell] = (ours, peer)
    return rows


def round_order(trees, round_index):
    """The trees in the order round round_index (from 0) runs them."""
    return list(trees) if round_index % 2 == 0 else list(reversed(trees))


def time_ratios(runs, first, second):
    """runs: {(round, tree): table_rows(...)}. {cell: ([ours' time second / first per round],
    [the peer's])}: speeds are TFLOPs/s, so the time ratio is first's speed over second's."""
    ratios = {}
    rounds = sorted({r for r, _ in runs})
    for r in rounds:
        a, b = runs.get((r, first), {}), runs.get((r, second), {})
        for cell in a.keys() & b.keys():
            ours, peer = ratios.setdefault(cell, ([], []))
            ours.append(a[cell][0] / b[cell][0])
            if a[cell][1] and b[cell][1]:
                peer.append(a[cell][1] / b[cell][1])
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--rounds", type=int, default=2)
    args, bench_args = parser.parse_known_args()
    trees = [str(pathlib.Path(t).resolve()) for t in (args.first, args.second)]
    runs = {}
    for r in range(args.rounds):
        for tree in round_order(trees, r):
            # No empty entry: it would put the working directory's package on the path too.
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
            done = subprocess.run([sys.executable, str(BENCH), *bench_args], env=env, capture_output=True, text=True)
            print(f"== round {r + 1} {tree}: exit {done.returncode}", flush=True)
            if done.returncode != 0:
                print(done.stderr[-2000:])
            runs[r, tree] = table_rows(done.stdout)
    print(f"time {args.second} / {args.first}, per round (the second tree ran first in rounds 2, 4, ...): ours | peer")
    for cell, (ours, peer) in sorted(time_ratios(runs, *trees).items()):
        print(f"{' '.join(map(str, cell)):30} mean {sum(ours) / len(ours):.3f}  "
              + " ".join(f"{x:.3f}" for x in ours) + "  | " + " ".join(f"{x:.3f}" for x in peer))


if __name__ == "__main__":
    main()
