"""A pre-norm GPT-2/GPT-3 style decoder with a selectable attention implementation (see
flash_attn_cuda.modules.MHA): token + learned position embeddings, blocks of
LayerNorm -> MHA -> residual and LayerNorm -> MLP (4x, GELU) -> residual, a final LayerNorm and an
LM head tied to the token embedding."""

import math
from dataclasses import dataclass

import torch
from torch import nn

from flash_attn_cuda.modules import MHA


@dataclass(frozen=True)
class GPTConfig:
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 128, for the LM head GEMM
    max_seqlen: int = 2048

    @property
    def head_dim(self):
        return self.hidden // self.n_heads


# The GPT-3 paper's shapes (Table 2.1); head dims 64, 64, 96, 128.
GPT3_CONFIGS = {
    "125M": GPTConfig(n_layers=12, hidden=768, n_heads=12),
    "350M": GPTConfig(n_layers=24, hidden=1024, n_heads=16),
    "760M": GPTConfig(n_layers=24, hidden=1536, n_heads=16),
    "1.3B": GPTConfig(n_layers=24, hidden=2048, n_heads=16),
}


def flops_per_token(n_params, n_layers, hidden, seqlen):
    """Training FLOPs (forward + backward) per token by the FlashAttention papers' formula:
    6 * seqlen * params + 12 * layers * hidden * seqlen^2 per sequence, divided by seqlen."""
    return 6 * n_params + 12 * n_layers * hidden * seqlen


class MLP(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config, impl):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden)
        self.attn = MHA(config.hidden, config.n_heads, causal=True, impl=impl)
        self.norm2 = nn.LayerNorm(config.hidden)
        self.mlp = MLP(config.hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config, impl="flash_attn_cuda"):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden)
        self.pos_emb = nn.Embedding(config.max_seqlen, config.hidden)
        self.blocks = nn.ModuleList(Block(config, impl) for _ in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.hidden)
        self.reset_parameters()

    def reset_parameters(self):
        """GPT-2's init: N(0, 0.02), with the projections that write into the residual stream
        scaled down by sqrt(2 * layers) so that its variance does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.out_proj, block.mlp.fc2):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layers))

    def forward(self, input_ids):
        """input_ids (batch, seqlen) int64 -> logits (batch, seqlen, vocab_size)."""
        if input_ids.shape[1] > self.config.max_seqlen:
            raise ValueError(f"seqlen {input_ids.shape[1]} is longer than max_seqlen {self.config.max_seqlen}")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm_f(x) @ self.tok_emb.weight.t()

    def num_params(self, non_embedding=False):
        """All parameters (the tied LM head counted once), or without both embedding tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return n
