"""Builds flash_attn_cuda._C. Knobs (environment variables), all optional:

FLASH_ATTN_CUDA_ARCHS  SASS to build, e.g. "80;90" or "90" (default: the archs of this machine's
                       GPUs, or "80;90" on a machine without one)
FLASH_ATTN_HDIMS       kernel head dims, e.g. "64,128" (default: all)
FLASH_ATTN_DTYPES      "fp16,bf16" (default) or one of them
MAX_JOBS               parallel compile jobs (ninja)
NVCC_THREADS           nvcc --threads (default 4)
CUTLASS_DIR            a CUTLASS checkout to use instead of the nvidia-cutlass package
"""

import importlib.util
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent

# torch.utils.cpp_extension reads CUDA_HOME when it is imported.
if "CUDA_HOME" not in os.environ and pathlib.Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from setuptools import find_packages, setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def _load_build_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "csrc" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_build_module("generate_kernels")
toolchain = _load_build_module("toolchain")


def _knob_list(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return list(default)
    return [item.strip() for item in raw.replace(";", ",").split(",") if item.strip()]


def _archs():
    items = _knob_list("FLASH_ATTN_CUDA_ARCHS", [])
    if not items:
        capabilities = toolchain.gpu_capabilities()
        archs = toolchain.archs_for_gpus(capabilities)
        print(f"flash_attn_cuda: FLASH_ATTN_CUDA_ARCHS not set: building for {archs}, from the GPUs seen "
              f"(compute capabilities {capabilities or 'none'})")
        return archs
    try:
        return toolchain.parse_archs(items)
    except ValueError as err:
        sys.exit(str(err))


def _check_cuda_toolkit():
    cuda_home = cpp_extension.CUDA_HOME
    error = toolchain.cuda_toolkit_error(cuda_home, toolchain.nvcc_release(cuda_home), torch.version.cuda)
    if error:
        sys.exit(error)


def _hdims():
    hdims = []
    for item in _knob_list("FLASH_ATTN_HDIMS", [str(d) for d in gen.HEAD_DIMS]):
        if not item.isdigit() or int(item) not in gen.HEAD_DIMS:
            sys.exit(f"FLASH_ATTN_HDIMS: {item!r} is not one of {', '.join(map(str, gen.HEAD_DIMS))}")
        hdims.append(int(item))
    return sorted(set(hdims))


def _dtypes():
    dtypes = _knob_list("FLASH_ATTN_DTYPES", list(gen.DTYPES))
    for item in dtypes:
        if item not in gen.DTYPES:
            sys.exit(f"FLASH_ATTN_DTYPES: {item!r} is not one of {', '.join(gen.DTYPES)}")
    return sorted(set(dtypes))


def _cutlass_include():
    try:
        return toolchain.cutlass_include(ROOT)
    except FileNotFoundError as error:
        sys.exit(str(error))


def _pip_cuda_include():
    """torch's CUDA headers include cusparse.h etc., which a toolkit with only nvcc lacks: the
    nvidia-* pip packages that come with torch carry them."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [str(p) for loc in spec.submodule_search_locations for p in pathlib.Path(loc).glob("cu*/include")]


def _extension():
    archs, hdims, dtypes = _archs(), _hdims(), _dtypes()
    _check_cuda_toolkit()
    if gen.main(["--check"]) != 0:
        gen.main([])
    families = [f for f in gen.families_for(archs) if f.built_head_dims(hdims)]
    family_hdims = {f.name: f.built_head_dims(hdims) for f in families}
    print(f"flash_attn_cuda: archs={archs} dtypes={dtypes} head dims per family={family_hdims}")
    macros = [f"-DFLASH_ATTN_DTYPE_{t.upper()}" for t in dtypes]
    # Host only: nvcc splits -D values at commas ("-DFLASH_ATTN_ARCHS=80,90" defines a macro "90").
    host_macros = [
        "-DFLASH_ATTN_ARCHS=" + ",".join(map(str, archs)),
        "-DFLASH_ATTN_KERNEL_HDIMS=" + ",".join(map(str, gen.HEAD_DIMS)),
    ]
    for name, dims in family_hdims.items():
        host_macros.append(f"-DFLASH_ATTN_{name.upper()}_HDIMS=" + ",".join(map(str, dims)))
        if name != "sm80":
            host_macros.append(f"-DFLASH_ATTN_FAMILY_{name.upper()}")
    for family in families:
        for direction in family.direction_head_dims:
            dims = family.built_head_dims(hdims, direction)
            host_macros.append(f"-DFLASH_ATTN_{family.name.upper()}_{direction.upper()}_HDIMS=" + ",".join(map(str, dims)))
    gencode = toolchain.gencode_flags(archs)
    nvcc_flags = [
        "-O3",
        "-std=c++17",
        "--use_fast_math",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-lineinfo",
        f"--threads={os.environ.get('NVCC_THREADS', '4')}",
    ]
    host_sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "api").glob("*.cpp"))
    host_sources += [f"csrc/{f.name}/family.cpp" for f in families]
    # flash_attn_with_kvcache's preparation kernels (plain CUDA, one file for every arch).
    host_sources += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "kvcache").glob("*.cu"))
    return CUDAExtension(
        name="flash_attn_cuda._C",
        sources=host_sources + gen.kernel_files(families, hdims, dtypes),
        include_dirs=[str(ROOT / "csrc"), str(_cutlass_include())] + _pip_cuda_include(),
        extra_compile_args={"cxx": ["-O3", "-std=c++20"] + host_macros + macros,
                            "nvcc": nvcc_flags + gencode + macros},
    )


setup(
    packages=find_packages(include=["flash_attn_cuda", "flash_attn_cuda.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
