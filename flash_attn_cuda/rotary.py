"""Rotary position embedding as flash_attn_with_kvcache applies it to q and the new keys."""

import torch


def apply_rotary(x, cos, sin, positions, interleaved):
    """x (batch, seqlen, nheads, head_dim) rotated at positions (batch, seqlen): its first
    rotary_dim = 2 * cos.shape[1] features, by the angles of rows positions of cos and sin
    (seqlen_ro, rotary_dim / 2); the other features unchanged. interleaved pairs features (0, 1),
    (2, 3), ... (GPT-J); otherwise (0, rotary_dim / 2), (1, rotary_dim / 2 + 1), ... (GPT-NeoX).
    Computed in float32 (float64 for float64 x) and rounded once to x's dtype, as flash-attn's
    kernel does."""
    half = cos.shape[1]
    compute = torch.promote_types(x.dtype, torch.float32)
    cos = cos[positions].to(compute).unsqueeze(2)  # (batch, seqlen, 1, half)
    sin = sin[positions].to(compute).unsqueeze(2)
    rotated = x[..., : 2 * half].to(compute)
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated[..., :half], rotated[..., half:]
    new_first = first * cos - second * sin
    new_second = first * sin + second * cos
    if interleaved:
        rotated = torch.stack((new_first, new_second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((new_first, new_second), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half :]), dim=-1)
