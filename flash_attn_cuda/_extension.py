"""Loads the compiled module flash_attn_cuda._C, which defines the ops torch.ops.flash_attn_cuda
(csrc/api/torch_ops.cpp), with a clear error when it was not built."""

import torch

_module = None


def load():
    """The module _C, imported with the ops' fake implementations (fake_ops.py) on the first call."""
    global _module
    if _module is None:
        try:
            from flash_attn_cuda import _C
        except ImportError as err:
            raise ImportError(
                "flash_attn_cuda's CUDA extension is not built: run `make install` "
                "(or `pip install --no-build-isolation -e .`) in the source tree"
            ) from err
        from flash_attn_cuda import fake_ops  # noqa: F401  (registers them)

        _module = _C
    return _module


def ops():
    """torch.ops.flash_attn_cuda, the extension loaded."""
    load()
    return torch.ops.flash_attn_cuda


def is_built():
    try:
        load()
    except ImportError:
        return False
    return True
