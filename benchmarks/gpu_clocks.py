"""The GPU's SM clock, power and throttle reasons while a benchmark runs, read by nvidia-smi every
100 ms, summarized into the results' metadata. Under sustained load an H100 runs at its power cap
with the clock well under boost, and two cards of one kind differ (benchmarks/NOTES.md, runs
333-338): a table without its clocks cannot tell a slower card from a slower kernel.

    with ClockSampler() as clocks:
        ...  # the timings
    meta["clocks"] = clocks.summary   # {} where nvidia-smi is missing
"""

import shutil
import statistics
import subprocess
import tempfile

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
IDLE = 0x1  # nvidia-smi's throttle reason bits
SW_POWER_CAP = 0x4
THERMAL = 0x20 | 0x40  # software and hardware thermal slowdown


def summarize(lines):
    """The samples of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` (one GPU) where
    it was busy (not idle, and drawing at least half the run's highest power: a benchmark also
    waits on the host, e.g. on torch.compile, with the GPU awake but unloaded): their median SM
    clock and power, the hottest, and the fractions with the power cap or a thermal slowdown active.
    {} without a busy sample."""
    awake = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        try:
            clock, power, temp, reasons = float(fields[0]), float(fields[1]), int(fields[2]), int(fields[3], 16)
        except ValueError:
            continue
        if not reasons & IDLE:
            awake.append((clock, power, temp, reasons))
    peak = max((a[1] for a in awake), default=0.0)
    busy = [a for a in awake if a[1] >= peak / 2]
    if not busy:
        return {}
    return {"busy_samples": len(busy),
            "sm_clock_mhz_median": statistics.median(b[0] for b in busy),
            "sm_clock_mhz_min": min(b[0] for b in busy),
            "power_w_median": round(statistics.median(b[1] for b in busy), 1),
            "temperature_c_max": max(b[2] for b in busy),
            "power_capped_fraction": round(sum(1 for b in busy if b[3] & SW_POWER_CAP) / len(busy), 3),
            "thermal_fraction": round(sum(1 for b in busy if b[3] & THERMAL) / len(busy), 3)}


def power_limit_w():
    """The GPU's enforced power limit in watts, or None."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True)
    try:
        return float(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


class ClockSampler:
    """nvidia-smi sampling GPU 0 for the duration of a with block; .summary afterwards."""

    def __init__(self, interval_ms=100):
        self.interval_ms = interval_ms
        self.summary = {}
        self._proc = None
        self._out = None

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._out = tempfile.TemporaryFile(mode="w+")
            self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                           "-i", "0", "-lms", str(self.interval_ms)], stdout=self._out,
                                          stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self._proc is None:
            return False
        self._proc.terminate()
        self._proc.wait()
        self._out.seek(0)
        self.summary = summarize(self._out.read().splitlines())
        limit = power_limit_w()
        if self.summary and limit is not None:
            self.summary["power_limit_w"] = limit
        self._out.close()
        return False
