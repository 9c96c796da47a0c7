import pytest
import torch

from flash_attn_cuda import _extension


def gpu_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if not _extension.is_built():
        return "the flash_attn_cuda extension is not built"
    return None


def kernel_skip_reason(head_dim, dtype):
    """Why the kernel for this head dim / dtype cannot run here, or None."""
    reason = gpu_skip_reason()
    if reason:
        return reason
    built = _extension.load().built_config()
    kernel_dim = (head_dim + 31) // 32 * 32
    if kernel_dim not in built["head_dims"]:
        return f"head dim {kernel_dim} not built (FLASH_ATTN_HDIMS)"
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    if name not in built["dtypes"]:
        return f"{name} not built (FLASH_ATTN_DTYPES)"
    return None


requires_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
