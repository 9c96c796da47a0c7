from flash_attn_cuda.models.gpt import GPT, GPT3_CONFIGS, GPTConfig, flops_per_token

__all__ = ["GPT", "GPT3_CONFIGS", "GPTConfig", "flops_per_token"]
