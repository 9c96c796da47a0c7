"""The built kernels' machine code (CPU; where the extension is built and a cuobjdump is found):
what ptxas decides and the source cannot pin down."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from flash_attn_cuda import _extension


def find_cuobjdump():
    """The CUDA toolkit's cuobjdump, else the copy triton ships (torch's CUDA wheels bring triton)."""
    candidates = [shutil.which("cuobjdump"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin",
                                                          "cuobjdump")]
    triton = importlib.util.find_spec("triton")
    if triton is not None and triton.origin:
        candidates.append(str(pathlib.Path(triton.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.fixture(scope="module")
def kernels():
    """{mangled kernel name: its SASS} of every kernel in the built extension."""
    if not _extension.is_built():
        pytest.skip("the extension is not built")
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton)")
    sass = subprocess.run([tool, "-sass", _extension.load().__file__], capture_output=True, text=True, check=True,
                          timeout=600).stdout
    functions = re.split(r"\n\s*Function : ", sass)[1:]
    return {body.split("\n", 1)[0].strip(): body for body in functions}


def main_backward_kernels(kernels):
    return {name: body for name, body in kernels.items()
            if "flash_bwd_kernel" in name or "flash_bwd_sm90_kernel" in name}


def test_float_adds_to_global_memory_are_reductions(kernels):
    """No kernel adds floats into global memory with an atomic that sends the old values back
    (ATOMG): the dQ accumulators' adds are reductions (REDG, or the bulk UBLKRED). ptxas turned the
    Hopper d=256 backward's float2 atomicAdd into ATOMG once (7ec479f; 14-17% slower, NOTES run 323)."""
    atomics = {name: sorted(set(re.findall(r"ATOMG\.[A-Z0-9.]*\.B?F(?:16|32|64)[A-Za-z0-9.]*", body)))
               for name, body in kernels.items()}
    assert {name: ops for name, ops in atomics.items() if ops} == {}


def test_every_backward_kernel_adds_dq_by_reduction(kernels):
    backward = main_backward_kernels(kernels)
    assert backward, "no main backward kernel found in the extension's SASS"
    missing = [name for name, body in backward.items() if not re.search(r"\b(?:REDG|UBLKRED)\.[A-Z0-9.]*F32", body)]
    assert missing == []


def test_hopper_plain_kernels_keep_their_registers(kernels):
    """The Hopper family's plain kernels (forward and backward, no score mod, dropout or
    deterministic order: the paths most calls take) use no local memory, as ptxas leaves them today:
    a spill there is local-memory traffic in every step. The variants kernels are not held to it
    (the d=128 backward's spill 32-48 bytes)."""
    plain = {name: body for name, body in kernels.items()
             if re.search(r"flash_(?:fwd|bwd)_sm90_kernel", name) and re.search(r"ELb[01]ELb0ELb0EEEvNS0_", name)}
    if not plain:
        pytest.skip("the sm90 family is not built")
    assert {name for name, body in plain.items() if re.search(r"\b(?:STL|LDL)\b", body)} == set()
