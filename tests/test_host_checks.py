"""Host programs that check the kernels' layout and index arithmetic on the CPU, built with the
toolkit's nvcc (no GPU needed)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "csrc"))
import toolchain  # noqa: E402

NVCC = pathlib.Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")


def run_host_check(source, tmp_path):
    """Builds tests/host/<source> against csrc and CUTLASS, runs it, returns its output; the program
    exits non-zero on a failed check."""
    if not NVCC.exists():
        pytest.skip("no nvcc")
    try:
        cutlass = toolchain.cutlass_include(ROOT)
    except FileNotFoundError as error:
        pytest.skip(str(error))
    exe = tmp_path / pathlib.Path(source).stem
    subprocess.run([str(NVCC), "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-I", str(ROOT / "csrc"), "-I",
                    str(cutlass), str(ROOT / "tests" / "host" / source), "-o", str(exe)], check=True, timeout=600)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def test_stmatrix_stores_put_every_entry_once_in_place(tmp_path):
    """The forward's O and the backward's dS^T go to shared memory by stmatrix (csrc/sm90/fwd_epilogue.h,
    bwd_consumer.h): simulated lane by lane, every accumulator entry lands once, at the offset of
    its coordinates, in every tile config (d = 256's two warpgroups each a half of dS^T)."""
    out = run_host_check("stmatrix_stores_check.cu", tmp_path)
    assert out.strip().endswith("0 failures")
    assert out.count("0 misplaced, 0 of") == 10


def test_tile_decode_matches_plain_division(tmp_path):
    """The Hopper forward's tile decode (csrc/sm90/tile_scheduler.h) divides through multipliers
    (csrc/common/fast_divmod.h): it must agree with / and % and map the tiles one to one, up to the
    largest grids the family takes."""
    out = run_host_check("tile_decode_check.cu", tmp_path)
    assert out.strip().endswith(" 0 failures")
