"""The benchmarks' timing (CPU): every timed call first runs for SETTLE_MS on its own, so that no
impl's timing depends on what ran before it (benchmarks/NOTES.md, runs 329-332)."""

import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import benchmark_attn  # noqa: E402
import benchmark_varlen  # noqa: E402

testing = pytest.importorskip("triton.testing")


@pytest.fixture
def timed(monkeypatch):
    """Calls of a fake kernel, and when do_bench took it over."""
    log = {"calls": [], "do_bench_at": None}
    monkeypatch.setattr(benchmark_attn, "SETTLE_MS", 60)
    monkeypatch.setattr(benchmark_attn.torch.cuda, "synchronize", lambda: None)

    def do_bench(fn, warmup, rep, return_mode):
        log["do_bench_at"] = time.perf_counter()
        assert fn is kernel and return_mode == "median"
        return 1.25

    def kernel():
        log["calls"].append(time.perf_counter())

    monkeypatch.setattr(testing, "do_bench", do_bench)
    return log, kernel


@pytest.mark.parametrize("time_ms", [benchmark_attn.time_ms, benchmark_varlen.time_ms],
                         ids=["attn_and_variants", "varlen"])
def test_the_call_runs_for_the_settle_time_before_it_is_timed(timed, time_ms):
    log, kernel = timed
    start = time.perf_counter()
    assert time_ms(kernel) == 1.25
    assert log["do_bench_at"] is not None
    before = [t for t in log["calls"] if t <= log["do_bench_at"]]
    assert len(before) > 1
    assert log["do_bench_at"] - start >= benchmark_attn.SETTLE_MS / 1000
