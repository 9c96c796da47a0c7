"""Causal multi-head self-attention whose attention implementation is chosen by name:
flash_attn_cuda, or PyTorch SDPA restricted to one backend. Nothing else differs between them."""

import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_cuda

SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa_math": SDPBackend.MATH,
}
IMPLS = ("flash_attn_cuda", *SDPA_BACKENDS)


def _flash_attn_causal(qkv):
    # The packed entry point writes the gradient of qkv in place. Looked up at call time so that
    # tests can monkeypatch it.
    return flash_attn_cuda.flash_attn_qkvpacked_func(qkv, causal=True)


def _sdpa_causal(backend):
    def attend(qkv):
        q, k, v = qkv.unbind(dim=2)
        with sdpa_kernel(backend):  # SDPA takes (batch, nheads, seqlen, d)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True)
        return out.transpose(1, 2)

    return attend


def causal_attention(impl):
    """impl's causal attention as f(qkv) -> out, qkv (batch, seqlen, 3, nheads, head_dim) and out
    (batch, seqlen, nheads, head_dim)."""
    if impl == "flash_attn_cuda":
        return _flash_attn_causal
    if impl in SDPA_BACKENDS:
        return _sdpa_causal(SDPA_BACKENDS[impl])
    raise ValueError(f"unknown attention impl {impl!r}; expected one of {', '.join(IMPLS)}")


class MHA(nn.Module):
    """Fused QKV projection, causal attention by `impl`, output projection."""

    def __init__(self, hidden, nheads, impl="flash_attn_cuda", bias=True):
        super().__init__()
        if hidden % nheads:
            raise ValueError(f"hidden {hidden} is not a multiple of nheads {nheads}")
        self.nheads, self.head_dim, self.impl = nheads, hidden // nheads, impl
        self.attend = causal_attention(impl)
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x):
        batch, seqlen, hidden = x.shape
        qkv = self.Wqkv(x).view(batch, seqlen, 3, self.nheads, self.head_dim)
        return self.out_proj(self.attend(qkv).reshape(batch, seqlen, hidden))

    def extra_repr(self):
        return f"nheads={self.nheads}, head_dim={self.head_dim}, impl={self.impl}"
