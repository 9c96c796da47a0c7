"""benchmark_attn.py's comparison with the recorded grid (CPU): a slower cell of ours is named,
unless SDPA flash slowed as much in the same run."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark_attn  # noqa: E402


def row(impl, tflops, seqlen=2048):
    return dict(direction="bwd", dtype="bf16", hdim=256, causal=False, seqlen=seqlen, impl=impl, tflops=tflops)


def key(impl, seqlen=2048):
    return ("bwd", "bf16", 256, False, seqlen, impl)


def test_a_slower_cell_is_named_against_the_record():
    recorded = {key("flash_attn_cuda"): 305.4, key("sdpa_flash"): 243.1}
    lines = benchmark_attn.against_record([row("flash_attn_cuda", 257.2), row("sdpa_flash", 246.0)], recorded)
    assert len(lines) == 1 and "d=256" in lines[0] and "305.4 -> 257.2" in lines[0]


def test_a_machine_slower_for_every_impl_is_not_ours():
    recorded = {key("flash_attn_cuda"): 300.0, key("sdpa_flash"): 250.0}
    rows = [row("flash_attn_cuda", 270.0), row("sdpa_flash", 225.0)]
    assert benchmark_attn.against_record(rows, recorded) == []


def test_small_changes_and_unrecorded_cells_pass():
    recorded = {key("flash_attn_cuda"): 300.0}
    rows = [row("flash_attn_cuda", 290.0), row("flash_attn_cuda", 100.0, seqlen=512)]
    assert benchmark_attn.against_record(rows, recorded) == []
    assert benchmark_attn.against_record([row("flash_attn_cuda", 280.0)], recorded) != []
