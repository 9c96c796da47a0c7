from flash_attn_cuda.modules.mha import IMPLS, MHA, causal_attention

__all__ = ["IMPLS", "MHA", "causal_attention"]
