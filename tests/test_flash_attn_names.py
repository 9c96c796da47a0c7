"""The names and signatures a flash-attn 2.x user imports, under flash_attn_cuda (CPU): changing
`flash_attn` to `flash_attn_cuda` in an import must be all it takes. The expected signatures are
flash-attn 2.8's (flash_attn/flash_attn_interface.py): parameter names, order and defaults."""

import inspect

import pytest

import flash_attn_cuda
from flash_attn_cuda import bert_padding, flash_attn_interface, interface, kvcache

COMMON = ("dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
          "deterministic=False, return_attn_probs=False")
FLASH_ATTN_SIGNATURES = {
    "flash_attn_func": f"(q, k, v, {COMMON})",
    "flash_attn_qkvpacked_func": f"(qkv, {COMMON})",
    "flash_attn_kvpacked_func": f"(q, kv, {COMMON})",
    "flash_attn_varlen_func": "(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, "
                              f"{COMMON}, block_table=None)",
    "flash_attn_varlen_qkvpacked_func": f"(qkv, cu_seqlens, max_seqlen, {COMMON})",
    "flash_attn_varlen_kvpacked_func": f"(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, {COMMON})",
    "flash_attn_with_kvcache": "(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, "
                               "cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None, "
                               "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
                               "rotary_interleaved=True, alibi_slopes=None, num_splits=0, "
                               "return_softmax_lse=False)",
}


def unannotated(signature):
    return str(signature.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                             for p in signature.parameters.values()]))


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_public_functions_have_flash_attns_signatures(name):
    assert unannotated(inspect.signature(getattr(flash_attn_cuda, name))) == FLASH_ATTN_SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES) + ["_get_block_size_n"])
def test_flash_attn_interface_module_exports_the_same_functions(name):
    """`from flash_attn.flash_attn_interface import ...` (flash-attn's own tests import
    _get_block_size_n from there) finds the package's functions."""
    source = kvcache if name == "flash_attn_with_kvcache" else interface
    assert getattr(flash_attn_interface, name) is getattr(source, name)
    if not name.startswith("_"):
        assert name in flash_attn_interface.__all__ and name in flash_attn_cuda.__all__
        assert getattr(flash_attn_cuda, name) is getattr(source, name)


@pytest.mark.parametrize("name", ["unpad_input", "pad_input", "index_first_axis", "index_put_first_axis",
                                  "unpad_input_for_concatenated_sequences", "IndexFirstAxis", "IndexPutFirstAxis"])
def test_bert_padding_has_flash_attns_names(name):
    assert callable(getattr(bert_padding, name))
