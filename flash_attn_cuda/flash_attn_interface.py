"""The module path flash-attn 2.x exports its functions from (flash_attn.flash_attn_interface), so
that `from flash_attn.flash_attn_interface import ...` carries over by renaming the package: the
public functions and _get_block_size_n, which flash-attn's tests import from here. flash-attn's
private op wrappers (_flash_attn_forward and the like) have no counterpart."""

from flash_attn_cuda.interface import (
    _get_block_size_n,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flash_attn_cuda.kvcache import flash_attn_with_kvcache

__all__ = [  # the package's root exports these too (__init__.py); _get_block_size_n only from here
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
