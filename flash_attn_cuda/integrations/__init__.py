"""Adapters that make other libraries run their attention on flash_attn_cuda (each imports its
library only when used)."""
