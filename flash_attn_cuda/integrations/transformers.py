"""flash_attn_cuda as an attention backend of Hugging Face transformers (5.x).

    from flash_attn_cuda.integrations.transformers import register
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation=register())

register() adds attention_forward to transformers' AttentionInterface and padding_mask to its
AttentionMaskInterface, under ATTN_IMPLEMENTATION; any model that looks its attention up there
(Llama, Qwen2, Mistral and most others) then runs on this package. A padded batch goes through
unpad_input and the varlen kernels; sequences packed into one row (position_ids that restart, or
transformers' cu_seq_lens_* kwargs) through cu_seqlens; GQA keys and values at their own head
count. The name holds no "flash": transformers 5.x takes any implementation named so for a build
of flash-attn (or a Hub kernel) and fails to load it.

transformers is imported by register() only: `pip install flash_attn_cuda[transformers]`.
"""

import torch

from flash_attn_cuda.bert_padding import index_first_axis, pad_input, unpad_input
from flash_attn_cuda.interface import flash_attn_func, flash_attn_varlen_func

ATTN_IMPLEMENTATION = "fa_cuda"


def register():
    """Registers the attention and mask functions with transformers; returns the name to pass as
    attn_implementation (or to model.set_attn_implementation)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as err:
        raise ImportError(
            "flash_attn_cuda.integrations.transformers needs transformers >= 5: "
            "pip install flash_attn_cuda[transformers]"
        ) from err
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, padding_mask)
    return ATTN_IMPLEMENTATION


def padding_mask(batch_size=None, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, **kwargs):
    """The mask transformers builds for each forward: None when every key is a token, else the
    (batch, keys) bool padding mask of the keys (True: a token), which attention_forward unpads
    with. Causality, the window and packing are not in it: attention_forward applies them.

    attention_mask is the 2-D mask over every token seen so far; the keys are its columns
    [kv_offset, kv_offset + kv_length). A static cache holds more slots than tokens: the mask then
    stops at the last token, and attention_forward drops the keys past it. transformers passes
    every argument by name (before 5.5 cache_position, not q_length and q_offset: neither is read).
    transformers asks for use_vmap where a model adds its own pattern to the mask (or_mask_function,
    and_mask_function: image tokens, bidirectional overlays), which the kernels cannot apply."""
    if kwargs.get("use_vmap"):
        raise NotImplementedError(
            "flash_attn_cuda's transformers backend cannot apply this model's own mask pattern "
            "(or_mask_function / and_mask_function); use attn_implementation='sdpa' for it"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, int(kv_offset):int(kv_offset) + kv_length].bool()
    if mask.shape[1] == kv_length and bool(mask.all()):
        return None
    return mask


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                      max_length_q=None, max_length_k=None, deterministic=None, **kwargs):
    """transformers' attention function: query (batch, heads, seqlen_q, head_dim), key and value
    (batch, heads_k, seqlen_k, head_dim), attention_mask from padding_mask. Returns (out (batch,
    seqlen_q, heads, head_dim), None): no attention weights."""
    for name in ("s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"flash_attn_cuda's transformers backend does not support {name}")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"flash_attn_cuda's transformers backend takes a 2-D padding mask, got a {attention_mask.dim()}-D "
            "attention mask: pass the (batch, seqlen) attention_mask to the model"
        )
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    options = dict(
        dropout_p=dropout if getattr(module, "training", False) else 0.0,
        softmax_scale=scaling,
        causal=causal,
        window_size=window_size(sliding_window, causal),
        softcap=0.0 if softcap is None else softcap,
        deterministic=bool(deterministic),
    )
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, head_dim) views
    if attention_mask is not None:
        return _attend_padded(q, k, v, attention_mask, options), None
    if cu_seq_lens_q is not None and cu_seq_lens_k is not None and max_length_q is not None:
        offsets = (cu_seq_lens_q.int(), cu_seq_lens_k.int(), int(max_length_q), int(max_length_k or max_length_q))
        return _attend_packed(q, k, v, offsets, options), None
    if position_ids is not None and q.shape[1] == k.shape[1]:
        offsets = _packed_offsets(position_ids, *q.shape[:2])
        if offsets is not None:
            return _attend_packed(q, k, v, offsets, options), None
    return flash_attn_func(q, k, v, **options), None


def window_size(sliding_window, causal):
    """transformers' sliding_window as flash-attn's (left, right). Its causal masks let query i see
    keys i - sliding_window < j <= i (sliding_window keys, itself included); its bidirectional ones
    |i - j| <= sliding_window."""
    if sliding_window is None:
        return (-1, -1)
    return (sliding_window - 1, 0) if causal else (sliding_window, sliding_window)


def _attend_padded(q, k, v, key_mask, options):
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k = key_mask.shape[1]
    k, v = k[:, :seqlen_k], v[:, :seqlen_k]  # a static cache's slots past the last token
    # Causal (or windowed) self-attention's queries are its newest keys, and are unpadded with them,
    # so that each sequence's bottom-right alignment holds. Otherwise every query row is kept: the
    # mask may be an encoder's, seen from a decoder (cross-attention) whose tokens it says nothing of.
    all_queries = not options["causal"] and options["window_size"] == (-1, -1)
    (indices_q, cu_q, max_q), (indices_k, cu_k, max_k) = _padding_layouts(key_mask, seqlen_q, all_queries)
    out = flash_attn_varlen_func(
        index_first_axis(q.reshape(batch * seqlen_q, heads, head_dim), indices_q),
        index_first_axis(k.reshape(batch * seqlen_k, *k.shape[2:]), indices_k),
        index_first_axis(v.reshape(batch * seqlen_k, *v.shape[2:]), indices_k),
        cu_q, cu_k, max_q, max_k, **options,
    )
    return pad_input(out, indices_q, batch, seqlen_q)


def _padding_layouts(key_mask, seqlen_q, all_queries):
    """((indices, cu_seqlens, max_seqlen) of the queries, the same of the keys). The queries are
    the last seqlen_q columns of the key mask, or all of them with all_queries. Reading max_seqlen
    syncs with the device, so the layouts are kept on the mask, which every layer of one forward
    gets."""
    version = None if key_mask.is_inference() else key_mask._version
    kept = getattr(key_mask, "_flash_attn_cuda_layouts", None)
    if kept is None or kept[:3] != (version, seqlen_q, all_queries):
        keys = _layout(key_mask)
        if all_queries:
            queries = _layout(key_mask.new_ones(key_mask.shape[0], seqlen_q))
        else:
            queries = keys if seqlen_q == key_mask.shape[1] else _layout(key_mask[:, -seqlen_q:])
        kept = (version, seqlen_q, all_queries, queries, keys)
        key_mask._flash_attn_cuda_layouts = kept
    return kept[3], kept[4]


def _layout(mask):
    _, indices, cu_seqlens, max_seqlen, _ = unpad_input(mask, mask)  # the mask as its own payload
    return indices, cu_seqlens, max_seqlen


def _attend_packed(q, k, v, offsets, options):
    batch, seqlen, heads, head_dim = q.shape
    cu_q, cu_k, max_q, max_k = offsets
    out = flash_attn_varlen_func(q.reshape(-1, heads, head_dim), k.reshape(-1, *k.shape[2:]),
                                 v.reshape(-1, *v.shape[2:]), cu_q, cu_k, max_q, max_k, **options)
    return out.view(batch, seqlen, heads, head_dim)


def _packed_offsets(position_ids, batch, seqlen):
    """(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen) of the sequences packed in the rows: a new
    one starts wherever a position does not follow the one before (as transformers' own masks read
    packing), and at each row. None when each row holds one sequence. Kept on position_ids, which
    every layer of one forward gets."""
    if position_ids.dim() != 2 or position_ids.shape[-1] != seqlen:
        return None
    version = None if position_ids.is_inference() else position_ids._version
    kept = getattr(position_ids, "_flash_attn_cuda_packing", None)
    if kept is None or kept[:2] != (version, batch):
        positions = position_ids.expand(batch, seqlen)
        starts = torch.ones_like(positions, dtype=torch.bool)
        starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
        offsets = None
        if int(starts.sum()) > batch:
            bounds = torch.nonzero(starts.flatten()).flatten()
            cu_seqlens = torch.cat([bounds, bounds.new_full((1,), batch * seqlen)]).to(torch.int32)
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
            offsets = (cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)
        kept = (version, batch, offsets)
        position_ids._flash_attn_cuda_packing = kept
    return kept[2]
