"""The build: generated instantiations, knob parsing and the dispatch table (CPU)."""

import os
import pathlib
import subprocess
import sys

import pytest

from flash_attn_cuda import _extension
from flash_attn_cuda.head_dims import KERNEL_HEAD_DIMS, kernel_head_dim

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "csrc"))
import generate_kernels  # noqa: E402


def test_instantiations_are_fresh():
    assert generate_kernels.main(["--check"]) == 0


def test_kernel_files_select_head_dims_and_dtypes():
    files = generate_kernels.kernel_files([generate_kernels.FAMILIES["sm80"]], [64], ["bf16"])
    assert files == [
        "csrc/instantiations/sm80/flash_fwd_hdim64_bf16_noncausal.cu",
        "csrc/instantiations/sm80/flash_fwd_hdim64_bf16_causal.cu",
        "csrc/instantiations/sm80/flash_bwd_hdim64_bf16_noncausal.cu",
        "csrc/instantiations/sm80/flash_bwd_hdim64_bf16_causal.cu",
    ]
    assert all((ROOT / f).exists() for f in generate_kernels.kernel_files())


def test_families_follow_the_archs():
    assert [f.name for f in generate_kernels.families_for([80])] == ["sm80"]
    assert "sm80" in [f.name for f in generate_kernels.families_for([90])]


def test_kernel_head_dim_rounds_up_to_the_next_kernel():
    assert [kernel_head_dim(d) for d in (1, 32, 33, 64, 100, 129, 255, 256)] == [32, 32, 64, 64, 128, 160, 256, 256]
    assert generate_kernels.HEAD_DIMS == KERNEL_HEAD_DIMS


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
    assert config["families"][0] == "sm80" and set(config["families"]) <= {"sm80", "sm90"}
    assert set(config["family_head_dims"]) == set(config["families"])
    assert config["family_head_dims"]["sm80"] == config["head_dims"]
    for family in config["families"]:
        assert set(config["family_head_dims"][family]) <= set(generate_kernels.FAMILIES[family].head_dims)


@needs_extension
@pytest.mark.parametrize("head_dim", generate_kernels.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_dispatch_table_entries_are_valid(head_dim, causal):
    block_m, block_n, warps = _extension.load().fwd_kernel_config(head_dim, causal)
    assert warps in (4, 8)
    assert block_m % (16 * warps) == 0
    assert block_n % 16 == 0 and block_n >= 16
    smem_bytes = 2 * (block_m + 2 * block_n) * head_dim
    assert smem_bytes <= 163 * 1024


@needs_extension
@pytest.mark.parametrize("head_dim", generate_kernels.HEAD_DIMS)
def test_backward_dispatch_table_entries_are_valid(head_dim):
    cfg = _extension.load().bwd_kernel_config(head_dim)
    warps = cfg["num_warps"]
    for atom_m, rows in ((cfg["atom_m_sdp"], cfg["block_m"]), (cfg["atom_m_dkv"], cfg["block_n"]),
                         (cfg["atom_m_dq"], cfg["block_m"])):
        assert warps % atom_m == 0 and rows % (16 * atom_m) == 0
    assert cfg["block_n"] % (16 * (warps // cfg["atom_m_sdp"])) == 0
    assert head_dim % (16 * (warps // cfg["atom_m_dkv"])) == 0 and head_dim % (16 * (warps // cfg["atom_m_dq"])) == 0
    assert cfg["stages_q_do"] in (1, 2)
    elems = 2 * cfg["block_n"] * head_dim + 2 * cfg["stages_q_do"] * cfg["block_m"] * head_dim
    assert cfg["smem_bytes"] == 2 * (elems + 2 * cfg["block_m"] * cfg["block_n"])
    assert cfg["smem_bytes"] <= 227 * 1024
