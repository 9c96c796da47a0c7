"""The benchmarks' comparison with their recorded results (CPU): a slower cell of ours is named,
unless the peer slowed as much in the same run."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark_attn  # noqa: E402

CELL = ("bwd", "bf16", "d=256", "causal=False", "seqlen=2048")


def test_a_slower_cell_is_named_against_the_record():
    recorded = {(CELL, "flash_attn_cuda"): 305.4, (CELL, "sdpa_flash"): 243.1}
    now = {(CELL, "flash_attn_cuda"): 257.2, (CELL, "sdpa_flash"): 246.0}
    lines = benchmark_attn.against_record(now, recorded, ["sdpa_flash"])
    assert len(lines) == 1 and "d=256" in lines[0] and "0.83x" in lines[0]


def test_a_machine_slower_for_every_impl_is_not_ours():
    recorded = {(CELL, "flash_attn_cuda"): 300.0, (CELL, "sdpa_flash"): 250.0}
    now = {(CELL, "flash_attn_cuda"): 270.0, (CELL, "sdpa_flash"): 225.0}
    assert benchmark_attn.against_record(now, recorded, ["sdpa_flash"]) == []


def test_the_first_peer_measured_in_both_runs_is_the_reference():
    recorded = {(CELL, "flash_attn_cuda"): 300.0, (CELL, "sdpa_flash"): 250.0}
    now = {(CELL, "flash_attn_cuda"): 270.0, (CELL, "flex"): 100.0, (CELL, "sdpa_flash"): 225.0}
    assert benchmark_attn.against_record(now, recorded, ["flex", "sdpa_flash"]) == []


def test_small_changes_and_unrecorded_cells_pass():
    other = CELL[:-1] + ("seqlen=512",)
    recorded = {(CELL, "flash_attn_cuda"): 300.0}
    assert benchmark_attn.against_record({(CELL, "flash_attn_cuda"): 290.0, (other, "flash_attn_cuda"): 1.0},
                                         recorded, ["sdpa_flash"]) == []
    assert benchmark_attn.against_record({(CELL, "flash_attn_cuda"): 280.0}, recorded, ["sdpa_flash"]) != []


def test_the_peer_may_sit_at_another_cell():
    none_cell, variant_cell = ("window", "none", "fwd"), ("window", "window", "fwd")
    recorded = {(none_cell, "flash_attn_cuda"): 10.0, (variant_cell, "flex"): 5.0}
    now = {(none_cell, "flash_attn_cuda"): 8.0, (variant_cell, "flex"): 4.0}
    peer_cell = lambda cell: (cell[0], cell[0]) + cell[2:]  # noqa: E731
    assert benchmark_attn.against_record(now, recorded, ["flex"], peer_cell=peer_cell) == []
    lines = benchmark_attn.against_record(now, recorded, ["flex"])
    assert len(lines) == 1 and "no peer" in lines[0]
