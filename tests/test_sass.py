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


def dump_by_arch(option):
    """[(arch, text)]: cuobjdump's output for option (-sass, -res-usage) on the built extension, by
    the arch of each cubin (a kernel is built once per arch of FLASH_ATTN_CUDA_ARCHS)."""
    if not _extension.is_built():
        pytest.skip("the extension is not built")
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton)")
    text = subprocess.run([tool, option, _extension.load().__file__], capture_output=True, text=True, check=True,
                          timeout=600).stdout
    return [(section.split(None, 1)[0], section) for section in re.split(r"\n\s*arch = ", text)[1:]]


@pytest.fixture(scope="module")
def kernels():
    """{(arch, mangled kernel name): its SASS} of every kernel in the built extension."""
    found = {}
    for arch, section in dump_by_arch("-sass"):
        for body in re.split(r"\n\s*Function : ", section)[1:]:
            found[arch, body.split("\n", 1)[0].strip()] = body
    assert found, "no kernel found in the extension's SASS"
    return found


@pytest.fixture(scope="module")
def registers():
    """{(arch, mangled kernel name): the registers a thread of the kernel starts with}."""
    found = {}
    for arch, section in dump_by_arch("-res-usage"):
        for name, regs in re.findall(r"Function (\S+):\s*REG:(\d+)", section):
            found[arch, name] = int(regs)
    assert found, "no kernel found in the extension's resource usage"
    return found


def hopper_code(kernels, name_pattern):
    """The sm_90a code of the Hopper kernels whose name matches (on other archs they are empty)."""
    return {name: body for (arch, name), body in kernels.items()
            if arch == "sm_90a" and re.search(name_pattern, name)}


def test_float_adds_to_global_memory_are_reductions(kernels):
    """No kernel adds floats into global memory with an atomic that sends the old values back
    (ATOM): the dQ accumulators' adds are reductions (RED, or the bulk UBLKRED). ptxas turned the
    Hopper d=256 backward's float2 atomicAdd into ATOMG once (7ec479f; 14-17% slower, NOTES run 323)."""
    atomics = {key: sorted(set(re.findall(r"\bATOMG?\.[A-Z0-9.]*\.B?F(?:16|32|64)[A-Za-z0-9.]*", body)))
               for key, body in kernels.items()}
    assert {key: ops for key, ops in atomics.items() if ops} == {}


def test_every_backward_kernel_adds_dq_by_reduction(kernels):
    """Both families' main backward kernels, on every arch built (RED below sm_90, REDG or the bulk
    UBLKRED on sm_90a)."""
    backward = {key: body for key, body in kernels.items() if "flash_bwd_kernel" in key[1]}
    backward.update({("sm_90a", name): body for name, body in hopper_code(kernels, "flash_bwd_sm90_kernel").items()})
    assert backward, "no main backward kernel found in the extension's SASS"
    reduction = r"\b(?:REDG?|UBLKRED)\.[A-Z0-9.]*ADD\.F32"
    assert [key for key, body in backward.items() if not re.search(reduction, body)] == []


def test_hopper_plain_kernels_keep_their_registers(kernels):
    """The Hopper family's plain kernels (forward and backward, no score mod, dropout or
    deterministic order: the paths most calls take) use no local memory, as ptxas leaves them today:
    a spill there is local-memory traffic in every step. The variants kernels are not held to it
    (the d=128 backward's spill 32-48 bytes)."""
    plain = hopper_code(kernels, r"flash_(?:fwd|bwd)_sm90_kernel.*ELb[01]ELb0ELb0EEEvNS0_")
    if not plain:
        pytest.skip("the sm90 family is not built")
    assert {name for name, body in plain.items() if re.search(r"\b(?:STL|LDL)\b", body)} == set()


def test_hopper_wgmma_run_asynchronously(kernels):
    """Every Hopper kernel issues its wgmma back to back, a warpgroup fence (WARPGROUP.ARRIVE) per
    GEMM, not per instruction: where ptxas cannot pair a wgmma with the wait for it (one under a
    branch it cannot prove warp-uniform, or issued and waited for under two branches), it serializes
    every wgmma of the kernel behind a fence and a wait of its own (C7513, C7518: a trial of the
    forward's cross-tile P V serialized 16 kernels so, benchmarks/NOTES.md, runs 355-356)."""
    hopper = hopper_code(kernels, r"flash_(?:fwd|bwd)_sm90_kernel")
    if not hopper:
        pytest.skip("the sm90 family is not built")
    fences = {name: (body.count("WARPGROUP.ARRIVE"), len(re.findall(r"\bHGMMA\.", body))) for name, body in hopper.items()}
    assert {name: counts for name, counts in fences.items() if 2 * counts[0] > counts[1]} == {}


def test_hopper_register_splits_fit_the_block(kernels, registers):
    """setmaxnreg: what the load warpgroup (128 threads) gives back covers what the consumers take,
    from the registers the block started with, else the consumers' setmaxnreg.inc waits forever (the
    d=128 forward hung so with 32 and 240 a thread: 32 x 128 + 240 x 256 = 65536, but 384 threads
    start with 168 each, 64512 in all; benchmarks/NOTES.md, run 435). A block has as many threads as
    fit its registers in 64K, in warpgroups (ptxas gives such a kernel all its launch bounds allow)."""
    hopper = hopper_code(kernels, r"flash_(?:fwd|bwd)_sm90_kernel")
    if not hopper:
        pytest.skip("the sm90 family is not built")
    short = {}
    for name, body in hopper.items():
        producers = {int(v, 16) for v in re.findall(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", body)}
        consumers = {int(v, 16) for v in re.findall(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", body)}
        assert len(producers) == 1 and len(consumers) == 1, name
        (producer,), (consumer,) = producers, consumers
        start = registers["sm_90a", name]
        threads = 65536 // start // 128 * 128
        if (start - producer) * 128 < (consumer - start) * (threads - 128):
            short[name] = (start, producer, consumer, threads)
    assert short == {}
