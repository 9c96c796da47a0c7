"""Multi-head self-attention whose attention implementation is chosen by name: flash_attn_cuda, or
PyTorch SDPA restricted to one backend. Nothing else differs between them."""

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


def _flash_attn(causal):
    def attend(qkv):
        # The packed entry point writes the gradient of qkv in place. Looked up at call time so that
        # tests can monkeypatch it.
        return flash_attn_cuda.flash_attn_qkvpacked_func(qkv, causal=causal)

    return attend


def _sdpa(backend, causal):
    def attend(qkv):
        q, k, v = qkv.unbind(dim=2)
        with sdpa_kernel(backend):  # SDPA takes (batch, nheads, seqlen, d)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal)
        return out.transpose(1, 2)

    return attend


def attention(impl, causal):
    """impl's attention as f(qkv) -> out, qkv (batch, seqlen, 3, nheads, head_dim) and out
    (batch, seqlen, nheads, head_dim)."""
    if impl == "flash_attn_cuda":
        return _flash_attn(causal)
    if impl in SDPA_BACKENDS:
        return _sdpa(SDPA_BACKENDS[impl], causal)
    raise ValueError(f"unknown attention impl {impl!r}; expected one of {', '.join(IMPLS)}")


class MHA(nn.Module):
    """Fused QKV projection, attention by `impl`, output projection. The constructor takes
    flash-attn's MHA names for what this layer has (flash_attn.modules.mha.MHA: embed_dim,
    num_heads, qkv_proj_bias, out_proj_bias, causal, not causal by default) and its weights are
    named as flash-attn's (Wqkv, out_proj); flash-attn's other options (num_heads_kv, cross
    attention, rotary embeddings, dropout, ...) are keyword-only here, so passing them raises a
    TypeError rather than being ignored."""

    def __init__(self, embed_dim, num_heads, *, causal=False, qkv_proj_bias=True, out_proj_bias=True,
                 impl="flash_attn_cuda"):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
        self.num_heads, self.head_dim, self.causal, self.impl = num_heads, embed_dim // num_heads, causal, impl
        self.attend = attention(impl, causal)
        self.Wqkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_proj_bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=out_proj_bias)

    def forward(self, x):
        batch, seqlen, embed_dim = x.shape
        qkv = self.Wqkv(x).view(batch, seqlen, 3, self.num_heads, self.head_dim)
        return self.out_proj(self.attend(qkv).reshape(batch, seqlen, embed_dim))

    def extra_repr(self):
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}, impl={self.impl}"
