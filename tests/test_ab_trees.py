"""benchmarks/ab_trees.py's parsing and ratios (CPU): the table benchmark_attn.py prints, the
alternated order, and time ratios from speeds."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import ab_trees  # noqa: E402

TABLE = """{'date': '2026-12-07', 'gpu': 'NVIDIA H100 80GB HBM3'}
[1/4 3s] fwd flash_attn_cuda bf16 d=128 causal=False seqlen=512: 486.5 TFLOPs/s
clocks: {'busy_samples': 623}
dir     dtype    d causal seqlen    ours     cudnn       fa4     xcudnn      xfa4
fwd     bf16   128 False     512   486.5     493.1     445.9       0.99      1.09
fwd     bf16   128 True    16384   641.1         -     630.1          -      1.02
record: fwd bf16 d=128: ours 0.95x its recorded speed (the peer 1.00x its own)
"""


def test_the_table_rows_are_read_and_the_rest_ignored():
    rows = ab_trees.table_rows(TABLE)
    assert rows == {("fwd", "bf16", 128, "False", 512): (486.5, 493.1),
                    ("fwd", "bf16", 128, "True", 16384): (641.1, None)}


def test_every_other_round_reverses_the_order():
    assert ab_trees.round_order(["a", "b"], 0) == ["a", "b"]
    assert ab_trees.round_order(["a", "b"], 1) == ["b", "a"]
    assert ab_trees.round_order(["a", "b"], 2) == ["a", "b"]


def test_time_ratios_invert_the_speeds_per_round():
    cell = ("fwd", "bf16", 256, "False", 1024)
    runs = {(0, "a"): {cell: (600.0, 500.0)}, (0, "b"): {cell: (625.0, 500.0)},
            (1, "a"): {cell: (610.0, 510.0)}, (1, "b"): {cell: (610.0, 500.0)}}
    ours, peer = ab_trees.time_ratios(runs, "a", "b")[cell]
    assert ours == [600.0 / 625.0, 1.0]
    assert peer == [1.0, 510.0 / 500.0]


def test_a_cell_missing_from_one_tree_is_left_out():
    cell, other = ("fwd", "bf16", 64, "True", 512), ("fwd", "bf16", 64, "True", 1024)
    runs = {(0, "a"): {cell: (300.0, None), other: (1.0, None)}, (0, "b"): {cell: (200.0, None)}}
    assert ab_trees.time_ratios(runs, "a", "b") == {cell: ([1.5], [])}
