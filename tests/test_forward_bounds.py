"""benchmarks/forward_bounds.py's arithmetic (CPU): the forward's minimum bytes and the bound."""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import forward_bounds  # noqa: E402


def test_the_forward_moves_q_k_v_and_o_once():
    q = torch.empty(32, 512, 16, 128, dtype=torch.bfloat16)
    assert forward_bounds.forward_bytes(q) == 4 * 32 * 512 * 2048 * 2


def test_the_bound_is_the_slower_of_streaming_and_the_flops():
    # 34.4 GFLOP (d=128 causal 512 on the grid) at 800 TFLOPs/s: 0.043 ms
    assert forward_bounds.bound_ms(0.095, 34.36e9, 800) == 0.095
    assert abs(forward_bounds.bound_ms(0.02, 34.36e9, 800) - 0.04295) < 1e-9
