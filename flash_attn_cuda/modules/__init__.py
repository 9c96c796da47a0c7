from flash_attn_cuda.modules.mha import IMPLS, MHA, attention

__all__ = ["IMPLS", "MHA", "attention"]
