"""python -m flash_attn_cuda: what is installed and built, which family serves this GPU, and a
two-second self check (a small forward and backward against the float32 reference on every built
family). Exits 0 only if the self check ran and passed."""

import sys

import torch

import flash_attn_cuda
from flash_attn_cuda import _extension
from flash_attn_cuda.reference import attention_ref


def report():
    print(f"flash_attn_cuda {flash_attn_cuda.__version__} ({flash_attn_cuda.__file__})")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    if not _extension.is_built():
        print("extension: not built (run `make install` in the source tree)")
        return None
    config = _extension.load().built_config()
    print(f"built: archs {config['archs']}, dtypes {config['dtypes']}")
    for family, dims in config["family_head_dims"].items():
        print(f"  family {family}: head dims {dims}")
    if not torch.cuda.is_available():
        print("GPU: none visible")
        return None
    major, minor = torch.cuda.get_device_capability()
    print(f"GPU: {torch.cuda.get_device_name()} (sm{major}{minor})")
    return config


def self_check(config):
    """A forward and backward at head dim 64 (or the first built), causal, GQA, odd lengths, on each
    family that serves this GPU, against the float32 reference. True if all pass."""
    import os

    head_dim = 64 if 64 in config["head_dims"] else config["head_dims"][0]
    dtype = torch.bfloat16 if "bf16" in config["dtypes"] else torch.float16
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 97, 4, head_dim, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(2, 131, 2, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out_ref, _ = attention_ref(*leaves, causal=True)
    refs = (out_ref, *torch.autograd.grad(out_ref, leaves, dout.float()))
    # The numerics rule of the tests: within twice the error of the standard implementation in the
    # inputs' dtype.
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out_pt, _ = attention_ref(*leaves, causal=True, upcast=False)
    baselines = [(a.float() - b).abs().max().item() for a, b in zip((out_pt, *torch.autograd.grad(out_pt, leaves, dout)),
                                                                    refs)]
    ok = True
    for family in ("sm90", "sm80"):
        forced = family == "sm80"
        if forced:
            os.environ["FLASH_ATTN_CUDA_FAMILY"] = "sm80"
        try:
            served = _extension.load().fwd_family(q, k, v, None, None, 0, 0, head_dim**-0.5, True)
            if served != family:
                continue
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            out = flash_attn_cuda.flash_attn_func(*leaves, causal=True)
            grads = torch.autograd.grad(out, leaves, dout)
        finally:
            if forced:
                del os.environ["FLASH_ATTN_CUDA_FAMILY"]
        errors = [(a.float() - b).abs().max().item() for a, b in zip((out, *grads), refs)]
        passed = all(e <= 2 * base + 1e-5 for e, base in zip(errors, baselines))
        ok &= passed
        print(f"self check, forward on {family}: max errors out/dq/dk/dv "
              + " ".join(f"{e:.1e}" for e in errors) + (" ok" if passed else " FAILED"))
    return ok


def main():
    config = report()
    if config is None:
        print("self check: not run")
        return 1
    return 0 if self_check(config) else 1


if __name__ == "__main__":
    sys.exit(main())
