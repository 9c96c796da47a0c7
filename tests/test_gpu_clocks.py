"""The benchmarks' clock sampling (CPU): nvidia-smi's samples summarized into the results' metadata,
with a stand-in nvidia-smi on PATH."""

import os
import pathlib
import stat
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_clocks  # noqa: E402

SAMPLES = [
    "345, 71.61, 39, 0x0000000000000001",  # idle: left out
    "1980, 420.50, 60, 0x0000000000000000",
    "1500, 699.00, 75, 0x0000000000000004",
    "1400, 701.00, 80, 0x0000000000000024",  # power cap and software thermal slowdown
    "1980, 120.00, 50, 0x0000000000000000",  # awake but unloaded (under half the peak): left out
    "[N/A], [N/A], 80, 0x0",  # unreadable: left out
    "garbage",
]


def test_summary_of_the_busy_samples():
    s = gpu_clocks.summarize(SAMPLES)
    assert s["busy_samples"] == 3
    assert s["sm_clock_mhz_median"] == 1500
    assert s["sm_clock_mhz_min"] == 1400
    assert s["power_w_median"] == 699.0
    assert s["temperature_c_max"] == 80
    assert s["power_capped_fraction"] == pytest.approx(2 / 3, abs=1e-3)
    assert s["thermal_fraction"] == pytest.approx(1 / 3, abs=1e-3)


def test_no_busy_sample_gives_an_empty_summary():
    assert gpu_clocks.summarize(SAMPLES[:1] + SAMPLES[5:]) == {}


def test_without_nvidia_smi_the_summary_is_empty(monkeypatch):
    monkeypatch.setattr(gpu_clocks.shutil, "which", lambda name: None)
    with gpu_clocks.ClockSampler() as clocks:
        pass
    assert clocks.summary == {}


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi that prints SAMPLES when sampling (then waits to be stopped) and 700 W as the
    power limit."""
    script = tmp_path / "nvidia-smi"
    lines = "\n".join(f"echo '{line}'" for line in SAMPLES)
    script.write_text("#!/bin/sh\n"
                      "case \"$*\" in *power.limit*) echo '700.00'; exit 0;; esac\n"
                      f"{lines}\n"
                      "exec sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return script


def test_sampler_summarizes_what_nvidia_smi_printed(fake_nvidia_smi):
    printed = sum(len(line) + 1 for line in SAMPLES)
    with gpu_clocks.ClockSampler() as clocks:
        deadline = time.monotonic() + 10
        while os.fstat(clocks._out.fileno()).st_size < printed and time.monotonic() < deadline:
            time.sleep(0.01)  # the with block of a benchmark lasts minutes; the stand-in's output, less
    assert clocks.summary["busy_samples"] == 3
    assert clocks.summary["power_capped_fraction"] == pytest.approx(2 / 3, abs=1e-3)
    assert clocks.summary["power_limit_w"] == 700.0
    assert clocks._proc.poll() is not None  # stopped
