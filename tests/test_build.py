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
import toolchain  # noqa: E402


def run_setup_name(**env):
    """`python setup.py --name` under these environment variables: what setup.py decides before any
    compiling (the knobs, the toolkit checks)."""
    return subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=120)


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
    proc = run_setup_name(**{knob: value})
    assert proc.returncode != 0
    assert message in proc.stderr


def test_archs_knob_is_parsed():
    assert toolchain.parse_archs(["90", "sm_80", "sm86", "80"]) == [80, 86, 90]
    for bad in ("75", "sm_70", "abc", "9.0"):
        with pytest.raises(ValueError, match="FLASH_ATTN_CUDA_ARCHS"):
            toolchain.parse_archs([bad])


@pytest.mark.parametrize(
    "capabilities,archs",
    [
        ([(9, 0)], [90]),
        ([(8, 6)], [86]),
        ([(8, 9), (8, 9)], [89]),
        ([(8, 0), (9, 0)], [80, 90]),
        ([(10, 0)], [100]),
        ([], [80, 90]),
        ([(7, 5)], [80, 90]),  # a GPU the kernels cannot run on: the default, for other machines
    ],
)
def test_default_archs_are_the_gpus_or_80_and_90(capabilities, archs):
    assert toolchain.archs_for_gpus(capabilities) == archs


def test_90_is_built_as_sm_90a():
    assert toolchain.gencode_flags([86, 90]) == [
        "-gencode=arch=compute_86,code=sm_86",
        "-gencode=arch=compute_90a,code=sm_90a",
    ]


def test_nvcc_release_is_parsed():
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"
    assert toolchain.parse_nvcc_release(text) == "13.0"
    assert toolchain.parse_nvcc_release("not nvcc") is None


@pytest.mark.parametrize(
    "cuda_home,nvcc,torch_cuda,message",
    [
        (None, None, "13.0", "CUDA_HOME"),
        ("/opt/cuda", None, "13.0", "no working nvcc at /opt/cuda/bin/nvcc"),
        ("/opt/cuda", "13.0", None, "CPU-only"),
        ("/opt/cuda", "12.8", "13.0", "nvcc at /opt/cuda is CUDA 12.8, but torch was built with CUDA 13.0"),
        ("/opt/cuda", "13.0", "12.8", "major versions must match"),
    ],
)
def test_cuda_toolkit_errors(cuda_home, nvcc, torch_cuda, message):
    assert message in toolchain.cuda_toolkit_error(cuda_home, nvcc, torch_cuda)


def test_cuda_toolkit_of_the_same_major_passes():
    assert toolchain.cuda_toolkit_error("/opt/cuda", "13.2", "13.0") is None


def test_missing_nvcc_fails_with_a_message(tmp_path):
    proc = run_setup_name(CUDA_HOME=str(tmp_path), FLASH_ATTN_CUDA_ARCHS="90")
    assert proc.returncode != 0
    assert f"no working nvcc at {tmp_path / 'bin' / 'nvcc'}" in proc.stderr


def test_nvcc_of_another_cuda_major_fails_with_a_message(tmp_path):
    import torch

    torch_major = (torch.version.cuda or "0").split(".")[0]
    other = "11.8" if torch_major != "11" else "12.4"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {other}, V{other}.0'\n")
    nvcc.chmod(0o755)
    proc = run_setup_name(CUDA_HOME=str(tmp_path), FLASH_ATTN_CUDA_ARCHS="90")
    assert proc.returncode != 0
    if torch.version.cuda is None:
        assert "CPU-only" in proc.stderr
    else:
        assert f"is CUDA {other}, but torch was built with CUDA {torch.version.cuda}" in proc.stderr


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
@pytest.mark.parametrize("large_smem", [False, True])
def test_backward_dispatch_table_entries_are_valid(head_dim, large_smem):
    cfg = _extension.load().bwd_kernel_config(head_dim, large_smem)
    warps = cfg["num_warps"]
    for atom_m, rows in ((cfg["atom_m_sdp"], cfg["block_m"]), (cfg["atom_m_dkv"], cfg["block_n"]),
                         (cfg["atom_m_dq"], cfg["block_m"])):
        assert warps % atom_m == 0 and rows % (16 * atom_m) == 0
    assert cfg["block_n"] % (16 * (warps // cfg["atom_m_sdp"])) == 0
    assert head_dim % (16 * (warps // cfg["atom_m_dkv"])) == 0 and head_dim % (16 * (warps // cfg["atom_m_dq"])) == 0
    assert cfg["stages_q_do"] in (1, 2)
    elems = 2 * cfg["block_n"] * head_dim + 2 * cfg["stages_q_do"] * cfg["block_m"] * head_dim
    assert cfg["smem_bytes"] == 2 * (elems + 2 * cfg["block_m"] * cfg["block_n"])
    # The base entry fits sm80's 163 KB, the large one sm90's 227 KB; both pad the dQ scratch to the
    # same block_m.
    assert cfg["smem_bytes"] <= (227 if large_smem else 163) * 1024
    assert cfg["block_m"] == _extension.load().bwd_kernel_config(head_dim, False)["block_m"]


def test_cutlass_include_follows_cutlass_dir(tmp_path, monkeypatch):
    """CUTLASS_DIR wins over the bundled and packaged headers; a folder without CuTe is named in the
    error."""
    monkeypatch.setenv("CUTLASS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="CUTLASS headers not found in " + str(tmp_path / "include")):
        toolchain.cutlass_include(ROOT)
    (tmp_path / "include" / "cute").mkdir(parents=True)
    (tmp_path / "include" / "cute" / "tensor.hpp").write_text("")
    assert toolchain.cutlass_include(ROOT) == tmp_path / "include"
