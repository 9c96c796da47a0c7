"""python -m flash_attn_cuda: the environment report, and the self check that decides its exit status."""

import pathlib
import subprocess
import sys

import torch

from flash_attn_cuda import _extension

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_report_and_self_check():
    proc = subprocess.run([sys.executable, "-m", "flash_attn_cuda"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.stdout.startswith("flash_attn_cuda ") and "torch " in proc.stdout
    if torch.cuda.is_available() and _extension.is_built():
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "self check, forward on sm80" in proc.stdout and "FAILED" not in proc.stdout
    else:
        assert proc.returncode == 1 and "self check: not run" in proc.stdout
