"""Loads the compiled module flash_attn_cuda._C, with a clear error when it was not built."""

import functools


@functools.cache
def load():
    try:
        from flash_attn_cuda import _C
    except ImportError as err:
        raise ImportError(
            "flash_attn_cuda's CUDA extension is not built: run `make install` "
            "(or `pip install --no-build-isolation -e .`) in the source tree"
        ) from err
    return _C


def is_built():
    try:
        load()
    except ImportError:
        return False
    return True
