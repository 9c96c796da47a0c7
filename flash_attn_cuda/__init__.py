"""FlashAttention-2 as a CUDA/CuTe PyTorch extension, with the flash-attn 2.x API."""

__version__ = "0.1.0"

from flash_attn_cuda import flash_attn_interface
from flash_attn_cuda.flash_attn_interface import *  # noqa: F401,F403 (the public functions)

__all__ = [*flash_attn_interface.__all__, "__version__"]
