"""The build: generated instantiations, knob parsing and the dispatch table (CPU)."""

import os
import pathlib
import subprocess
import sys

import pytest

from flash_attn_cuda import _extension

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "csrc"))
import generate_kernels  # noqa: E402


def test_instantiations_are_fresh():
    assert generate_kernels.main(["--check"]) == 0


def test_kernel_files_select_head_dims_and_dtypes():
    files = generate_kernels.kernel_files([64], ["bf16"])
    assert files == [
        "csrc/instantiations/flash_fwd_hdim64_bf16_noncausal.cu",
        "csrc/instantiations/flash_fwd_hdim64_bf16_causal.cu",
        "csrc/instantiations/flash_bwd_hdim64_bf16_noncausal.cu",
        "csrc/instantiations/flash_bwd_hdim64_bf16_causal.cu",
    ]
    assert all((ROOT / f).exists() for f in generate_kernels.kernel_files())


@pytest.mark.parametrize(
    "knob,value,message",
    [
        ("FLASH_ATTN_CUDA_ARCHS", "75", "FLASH_ATTN_CUDA_ARCHS"),
        ("FLASH_ATTN_HDIMS", "48", "FLASH_ATTN_HDIMS"),
        ("FLASH_ATTN_DTYPES", "fp32", "FLASH_ATTN_DTYPES"),
    ],
)
def test_bad_knob_fails_naming_it(knob, value, message):
    env = dict(os.environ, **{knob: value})
    proc = subprocess.run(
        [sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert message in proc.stderr


needs_extension = pytest.mark.skipif(not _extension.is_built(), reason="the extension is not built")


@needs_extension
def test_built_config_lists_what_was_built():
    config = _extension.load().built_config()
    assert config["archs"] and all(a >= 80 for a in config["archs"])
    assert set(config["head_dims"]) <= set(generate_kernels.HEAD_DIMS) and config["head_dims"]
    assert set(config["dtypes"]) <= {"fp16", "bf16"} and config["dtypes"]


@needs_extension
@pytest.mark.parametrize("head_dim", generate_kernels.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sm", [80, 90])
def test_dispatch_table_entries_are_valid(head_dim, causal, sm):
    block_m, block_n, warps, stages = _extension.load().fwd_kernel_config(head_dim, causal, sm)
    assert warps in (4, 8)
    assert block_m % (16 * warps) == 0
    assert block_n % 16 == 0 and block_n >= 16
    assert stages == 1
    smem_bytes = 2 * (block_m + 2 * block_n) * head_dim
    smem_limit = 227 * 1024 if sm >= 90 else 163 * 1024
    assert smem_bytes <= smem_limit


@needs_extension
@pytest.mark.parametrize("head_dim", generate_kernels.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sm", [80, 90])
def test_backward_dispatch_table_entries_are_valid(head_dim, causal, sm):
    cfg = _extension.load().bwd_kernel_config(head_dim, causal, sm)
    warps = cfg["num_warps"]
    for atom_m, rows in ((cfg["atom_m_sdp"], cfg["block_m"]), (cfg["atom_m_dkv"], cfg["block_n"]),
                         (cfg["atom_m_dq"], cfg["block_m"])):
        assert warps % atom_m == 0 and rows % (16 * atom_m) == 0
    assert cfg["block_n"] % (16 * (warps // cfg["atom_m_sdp"])) == 0
    assert head_dim % (16 * (warps // cfg["atom_m_dkv"])) == 0 and head_dim % (16 * (warps // cfg["atom_m_dq"])) == 0
    assert cfg["stages_q_do"] in (1, 2)
    elems = 2 * cfg["block_n"] * head_dim + 2 * cfg["stages_q_do"] * cfg["block_m"] * head_dim
    assert cfg["smem_bytes"] == 2 * (elems + 2 * cfg["block_m"] * cfg["block_n"])
    assert cfg["smem_bytes"] <= (227 if sm >= 90 else 163) * 1024


@needs_extension
def test_dispatch_table_rounds_head_dim_up():
    load = _extension.load()
    assert load.fwd_kernel_config(40, False, 90) == load.fwd_kernel_config(64, False, 90)
    assert load.fwd_kernel_config(112, True, 90) == load.fwd_kernel_config(128, True, 90)
