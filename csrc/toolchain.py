"""What setup.py needs to know about the machine: the archs to compile for, whether the CUDA
toolkit can build for this torch, and where the CUTLASS headers are. The decisions are pure
functions of their inputs (tested in tests/test_build.py without a GPU); the probes that gather the
inputs are kept apart."""

import importlib.util
import os
import re
import subprocess
from pathlib import Path

DEFAULT_ARCHS = [80, 90]
MIN_ARCH = 80


def parse_archs(items):
    """["80", "sm_90", ...] (the FLASH_ATTN_CUDA_ARCHS knob split) -> sorted unique ints; raises
    ValueError naming the knob for an item that is not an arch >= 80."""
    archs = set()
    for item in items:
        digits = item.lower().removeprefix("sm_").removeprefix("sm")
        if not digits.isdigit() or int(digits) < MIN_ARCH:
            raise ValueError(
                f"FLASH_ATTN_CUDA_ARCHS: {item!r} is not an arch >= {MIN_ARCH} (examples: 80, 86, 89, 90)"
            )
        archs.add(int(digits))
    return sorted(archs)


def archs_for_gpus(capabilities):
    """The archs of the visible GPUs ((major, minor) pairs: (9, 0) -> 90) that can run the kernels,
    or DEFAULT_ARCHS where there is none."""
    archs = sorted({major * 10 + minor for major, minor in capabilities if major * 10 + minor >= MIN_ARCH})
    return archs or list(DEFAULT_ARCHS)


def gencode_flags(archs):
    """nvcc's -gencode flags. 90 is built as sm_90a (not sm_90): the Hopper family's wgmma and
    setmaxnreg exist only there; the FA2 family runs the same on either."""
    return [f"-gencode=arch=compute_{a}{'a' if a == 90 else ''},code=sm_{a}{'a' if a == 90 else ''}" for a in archs]


def parse_nvcc_release(version_text):
    """`nvcc --version`'s output -> its release ("13.0"), or None."""
    match = re.search(r"release (\d+)\.(\d+)", version_text or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def cuda_toolkit_error(cuda_home, nvcc_release, torch_cuda):
    """Why this toolkit cannot build the extension for this torch, or None. cuda_home: the toolkit
    root torch found (None if none); nvcc_release: what its bin/nvcc reports (None if it is missing);
    torch_cuda: torch.version.cuda (None for a CPU-only torch)."""
    if cuda_home is None:
        return ("flash_attn_cuda: no CUDA toolkit found. Set CUDA_HOME to its root (the folder holding "
                "bin/nvcc), e.g. CUDA_HOME=/usr/local/cuda, or put nvcc on PATH.")
    if nvcc_release is None:
        return (f"flash_attn_cuda: no working nvcc at {Path(cuda_home) / 'bin' / 'nvcc'} (CUDA_HOME={cuda_home}). "
                f"Set CUDA_HOME to the root of a CUDA toolkit.")
    if torch_cuda is None:
        return ("flash_attn_cuda: this torch is a CPU-only build (torch.version.cuda is None). Install a "
                "CUDA build of torch whose CUDA major version is that of nvcc "
                f"({nvcc_release}).")
    if nvcc_release.split(".")[0] != torch_cuda.split(".")[0]:
        return (f"flash_attn_cuda: nvcc at {cuda_home} is CUDA {nvcc_release}, but torch was built with "
                f"CUDA {torch_cuda}: the major versions must match. Point CUDA_HOME to a CUDA "
                f"{torch_cuda.split('.')[0]}.x toolkit, or install a torch built for CUDA "
                f"{nvcc_release.split('.')[0]}.")
    return None


def gpu_capabilities():
    """The compute capabilities of the GPUs torch sees ([] without one)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]


def nvcc_release(cuda_home):
    """The release of cuda_home's nvcc, or None if it is missing or does not run."""
    if cuda_home is None:
        return None
    try:
        result = subprocess.run([str(Path(cuda_home) / "bin" / "nvcc"), "--version"], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvcc_release(result.stdout) if result.returncode == 0 else None


def cutlass_include(root):
    """The CUTLASS include folder: $CUTLASS_DIR/include, root/third_party/cutlass/include, or the
    nvidia-cutlass package's; raises FileNotFoundError saying where it looked."""
    if os.environ.get("CUTLASS_DIR"):
        include = Path(os.environ["CUTLASS_DIR"]) / "include"
    elif (Path(root) / "third_party" / "cutlass" / "include").is_dir():
        include = Path(root) / "third_party" / "cutlass" / "include"
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                "CUTLASS headers not found: pip install nvidia-cutlass==4.2.0.0, or set CUTLASS_DIR to a checkout"
            )
        include = Path(spec.origin).parent / "source" / "include"
    if not (include / "cute" / "tensor.hpp").exists():
        raise FileNotFoundError(
            f"CUTLASS headers not found in {include} (CUTLASS_DIR, third_party/cutlass or nvidia-cutlass)"
        )
    return include
