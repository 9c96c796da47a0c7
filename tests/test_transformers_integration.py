"""flash_attn_cuda.integrations.transformers: tiny randomly initialized Llama, Qwen2, Mistral (and
Gemma-2 for softcap) models on this backend against the same models on transformers' own
attention. On the CPU the kernels are stood in for by the plain-torch reference (the wiring:
layouts, masks, padding, packing, options); on the GPU they run, under the numerics rule."""

import copy
import subprocess
import sys

import pytest
import torch

from conftest import assert_within_rule, requires_gpu, skip_unbuilt
from flash_attn_cuda.reference import attention_ref

transformers = pytest.importorskip("transformers")

import flash_attn_cuda.integrations.transformers as backend  # noqa: E402

VOCAB = 512
HEAD_DIM = 64
WINDOW = 16
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=HEAD_DIM,
              pad_token_id=0, bos_token_id=None, eos_token_id=None,  # generate() runs max_new_tokens
              initializer_range=0.1)  # larger than the default, so that attention is far from uniform
CONFIGS = {
    "llama": ("LlamaConfig", COMMON),
    "qwen2": ("Qwen2Config", COMMON),
    "mistral": ("MistralConfig", {**COMMON, "sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", {**COMMON, "sliding_window": WINDOW, "attn_logit_softcapping": 2.0,
                                "query_pre_attn_scalar": 32}),
    "bart": ("BartConfig", dict(vocab_size=VOCAB, d_model=128, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=256,
                                decoder_ffn_dim=256, init_std=0.1, pad_token_id=0, bos_token_id=None,
                                eos_token_id=None, forced_eos_token_id=None, decoder_start_token_id=2)),
}
MODELS = ["llama", "qwen2", "mistral"]


def tiny_models(kind, variants, device, seed=0):
    """{name: model} for variants {name: (attn_implementation, dtype)}: copies of one randomly
    initialized model."""
    class_name, kwargs = CONFIGS[kind]
    config = getattr(transformers, class_name)(**kwargs)
    torch.manual_seed(seed)
    auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
    base = auto.from_config(config)
    models = {}
    for name, (attn, dtype) in variants.items():
        model = copy.deepcopy(base).to(device=device, dtype=dtype).eval()
        model.set_attn_implementation(attn)
        models[name] = model
    return models


def token_batch(lengths, seqlen, side, device, seed=0):
    """(input_ids, attention_mask) of len(lengths) rows of seqlen, row b holding lengths[b] tokens
    and padding (id 0) on the given side."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), seqlen), generator=gen)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for row, n in enumerate(lengths):
        if side == "left":
            mask[row, seqlen - n:] = 1
        else:
            mask[row, :n] = 1
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def generation_positions(mask):
    """The position_ids generate() gives a padded batch."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def packed_row(lengths, device, seed=0):
    """(input_ids (1, total), position_ids restarting at 0 for each sequence, the sequences' ids)."""
    gen = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(1, VOCAB, (1, n), generator=gen).to(device) for n in lengths]
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    return torch.cat(sequences, dim=1), positions, sequences


def reference_kernel(q, k, v, options):
    return attention_ref(q, k, v, causal=options["causal"], softmax_scale=options["softmax_scale"],
                         window_size=options["window_size"], softcap=options["softcap"])[0]


@pytest.fixture
def stand_in(monkeypatch):
    """Replaces the kernels the backend calls with the plain-torch reference; returns the list of
    calls (entry point, q's shape, k's shape, options)."""
    calls = []

    def dense(q, k, v, **options):
        calls.append(("dense", q.shape, k.shape, options))
        return reference_kernel(q, k, v, options)

    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
        calls.append(("varlen", q.shape, k.shape, options))
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert max_seqlen_q == max(b - a for a, b in zip(cu_q, cu_q[1:]))
        assert max_seqlen_k == max(b - a for a, b in zip(cu_k, cu_k[1:]))
        outs = [reference_kernel(q[a:b][None], k[c:d][None], v[c:d][None], options)[0]
                for a, b, c, d in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]
        return torch.cat(outs)

    monkeypatch.setattr(backend, "flash_attn_func", dense)
    monkeypatch.setattr(backend, "flash_attn_varlen_func", varlen)
    backend.register()
    return calls


def cpu_models(kind):
    return tiny_models(kind, {"ours": (backend.ATTN_IMPLEMENTATION, torch.float32),
                              "sdpa": ("sdpa", torch.float32)}, "cpu")


# CPU: the wiring, with the stand-in kernels.


def test_importing_the_package_does_not_import_transformers():
    code = ("import sys, flash_attn_cuda, flash_attn_cuda.integrations.transformers; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_register_adds_the_attention_and_the_mask_function():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = backend.register()
    assert name == backend.ATTN_IMPLEMENTATION and "flash" not in name
    assert ALL_ATTENTION_FUNCTIONS[name] is backend.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is backend.padding_mask


def test_window_size_is_the_window_of_transformers_masks():
    assert backend.window_size(None, True) == (-1, -1)
    assert backend.window_size(WINDOW, True) == (WINDOW - 1, 0)  # query i sees i - 15 .. i
    assert backend.window_size(WINDOW, False) == (WINDOW, WINDOW)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_logits_match_sdpa(stand_in, kind, side):
    models = cpu_models(kind)
    lengths = [40, 40] if side == "none" else [40, 23]
    ids, mask = token_batch(lengths, 40, "left" if side == "none" else side, "cpu")
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits for name, model in models.items()}
    valid = mask.bool()
    torch.testing.assert_close(logits["ours"][valid], logits["sdpa"][valid], rtol=1e-4, atol=1e-5)
    assert {call[0] for call in stand_in} == {"dense" if side == "none" else "varlen"}
    # (batch, seqlen, heads, head_dim) or (tokens, heads, head_dim); GQA keys at their own head count
    assert all(call[1][-2:] == (4, HEAD_DIM) and call[2][-2:] == (2, HEAD_DIM) for call in stand_in)
    window = (WINDOW - 1, 0) if kind == "mistral" else (-1, -1)
    assert all(call[3]["window_size"] == window and call[3]["causal"] for call in stand_in)


@pytest.mark.parametrize("kind", MODELS)
def test_packed_sequences_match_separate_runs(stand_in, kind):
    models = cpu_models(kind)
    ids, positions, sequences = packed_row([7, 30, 1, 12], "cpu")
    with torch.no_grad():
        packed = models["ours"](ids, position_ids=positions).logits
        separate = torch.cat([models["sdpa"](seq).logits for seq in sequences], dim=1)
    torch.testing.assert_close(packed, separate, rtol=1e-4, atol=1e-5)
    assert {call[0] for call in stand_in} == {"varlen"}


def test_packed_sequences_from_cu_seq_lens_kwargs(stand_in):
    models = cpu_models("llama")
    ids, positions, sequences = packed_row([5, 9], "cpu")
    cu_seqlens = torch.tensor([0, 5, 14])
    with torch.no_grad():
        packed = models["ours"](ids, position_ids=positions, cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
                                max_length_q=9, max_length_k=9).logits
        separate = torch.cat([models["sdpa"](seq).logits for seq in sequences], dim=1)
    torch.testing.assert_close(packed, separate, rtol=1e-4, atol=1e-5)


def test_backward_matches_sdpa(stand_in):
    models = cpu_models("llama")
    ids, mask = token_batch([40, 23], 40, "right", "cpu")
    grads = {}
    for name, model in models.items():
        model.train()
        model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        attn = model.model.layers[0].self_attn
        grads[name] = [p.grad for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)]
    for ours, sdpa in zip(grads["ours"], grads["sdpa"]):
        torch.testing.assert_close(ours, sdpa, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", MODELS)
def test_greedy_generate_matches_sdpa(stand_in, kind):
    """A left-padded batch: the prefill unpads, each decoding step is one query per row against
    the cache (past the window for Mistral)."""
    models = cpu_models(kind)
    ids, mask = token_batch([12, 5], 12, "left", "cpu")
    tokens = {name: model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
              for name, model in models.items()}
    assert torch.equal(tokens["ours"], tokens["sdpa"])


def test_dropout_only_in_training(stand_in):
    config = transformers.LlamaConfig(**COMMON, attention_dropout=0.25)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=backend.ATTN_IMPLEMENTATION)
    ids, _ = token_batch([8], 8, "left", "cpu")
    model.train()
    model(ids)
    model.eval()
    model(ids)
    # A module in eval mode runs without dropout even where a model passes its rate regardless.
    backend.attention_forward(model.model.layers[0].self_attn, *torch.randn(3, 1, 4, 8, HEAD_DIM), None, dropout=0.25)
    assert [call[3]["dropout_p"] for call in stand_in] == [0.25, 0.25, 0.0, 0.0, 0.0]


def test_softcap_and_scaling_match_eager(stand_in):
    """Gemma-2 (softcap, a query_pre_attn_scalar scale, sliding and full layers): SDPA ignores
    softcap, eager applies it."""
    models = tiny_models("gemma2", {"ours": (backend.ATTN_IMPLEMENTATION, torch.float32),
                                    "eager": ("eager", torch.float32)}, "cpu")
    ids, mask = token_batch([40, 30], 40, "left", "cpu")
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits for name, model in models.items()}
    valid = mask.bool()
    torch.testing.assert_close(logits["ours"][valid], logits["eager"][valid], rtol=1e-4, atol=1e-5)
    assert {(call[3]["softcap"], call[3]["softmax_scale"]) for call in stand_in} == {(2.0, 32**-0.5)}
    assert {call[3]["window_size"] for call in stand_in} == {(WINDOW - 1, 0), (-1, -1)}


def test_encoder_decoder_matches_sdpa(stand_in):
    """BART with a right-padded encoder batch: its self-attention unpads queries with keys, the
    decoder's cross-attention (here as long as the encoder) keeps every decoder query."""
    models = tiny_models("bart", {"ours": (backend.ATTN_IMPLEMENTATION, torch.float32),
                                  "sdpa": ("sdpa", torch.float32)}, "cpu")
    ids, mask = token_batch([20, 13], 20, "right", "cpu")
    decoder_ids, _ = token_batch([20, 20], 20, "right", "cpu", seed=1)
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
                  for name, model in models.items()}
    torch.testing.assert_close(logits["ours"], logits["sdpa"], rtol=1e-4, atol=1e-5)
    tokens = {name: model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
              for name, model in models.items()}
    assert torch.equal(tokens["ours"], tokens["sdpa"])


def test_what_the_backend_cannot_do_raises(stand_in):
    q = torch.randn(1, 4, 8, HEAD_DIM)
    k = v = torch.randn(1, 2, 8, HEAD_DIM)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="2-D padding mask"):
        backend.attention_forward(module, q, k, v, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="s_aux"):
        backend.attention_forward(module, q, k, v, None, s_aux=torch.zeros(4))


def test_a_model_s_own_mask_pattern_raises(stand_in):
    """Gemma-3 with bidirectional attention adds its pattern through or_mask_function."""
    config = transformers.Gemma3TextConfig(**COMMON, sliding_window=WINDOW, use_bidirectional_attention=True)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=backend.ATTN_IMPLEMENTATION)
    with pytest.raises(NotImplementedError, match="mask pattern"):
        model(token_batch([8], 8, "left", "cpu")[0])


def test_padding_mask_holds_the_padding_of_the_keys():
    full = torch.ones(2, 10, dtype=torch.bool)
    assert backend.padding_mask(2, 10, 10, attention_mask=full) is None
    assert backend.padding_mask(2, 10, 10, attention_mask=None) is None
    padded = full.clone()
    padded[0, :3] = False
    assert torch.equal(backend.padding_mask(2, 1, 8, kv_offset=2, attention_mask=padded), padded[:, 2:])
    # A static cache of 16 slots holding 10 tokens: the mask stops at the last token.
    assert torch.equal(backend.padding_mask(2, 1, 16, attention_mask=full), full)


# GPU: the kernels, bf16, against the same model on SDPA in bf16 (the standard implementation) and
# in float32 (the reference), under the numerics rule of DESIGN.md.

def gpu_models(kind, standard="sdpa"):
    skip_unbuilt(HEAD_DIM, torch.bfloat16)
    backend.register()
    return tiny_models(kind, {"ours": (backend.ATTN_IMPLEMENTATION, torch.bfloat16),
                              "standard": (standard, torch.bfloat16),
                              "reference": (standard, torch.float32)}, "cuda")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("side", ["none", "left", "right"])
def test_gpu_logits_match_sdpa(kind, side):
    models = gpu_models(kind)
    # 80 tokens: past Mistral's window of 16
    ids, mask = token_batch([80, 80] if side == "none" else [80, 37], 80, "left" if side == "none" else side, "cuda")
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits for name, model in models.items()}
    valid = mask.bool()
    assert_within_rule("logits", logits["ours"][valid], logits["reference"][valid], logits["standard"][valid])


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("side", ["none", "right"])
def test_gpu_backward_matches_sdpa(kind, side):
    models = gpu_models(kind)
    ids, mask = token_batch([80, 80] if side == "none" else [80, 37], 80, "right", "cuda")
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for name, model in models.items():
        model.train()
        model(ids, attention_mask=mask, labels=labels).loss.backward()
        attn = model.model.layers[0].self_attn
        grads[name] = [p.grad for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                                        model.model.embed_tokens.weight)]
    for name, ours, ref, standard in zip(("dWq", "dWk", "dWv", "dEmbedding"), *grads.values()):
        assert_within_rule(name, ours, ref, standard)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", MODELS)
def test_gpu_packed_sequences_match_separate_runs(kind):
    models = gpu_models(kind)
    ids, positions, sequences = packed_row([7, 50, 1, 33], "cuda")
    with torch.no_grad():
        packed = models["ours"](ids, position_ids=positions).logits
        separate = {name: torch.cat([models[name](seq).logits for seq in sequences], dim=1)
                    for name in ("standard", "reference")}
    assert_within_rule("logits", packed, separate["reference"], separate["standard"])


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", MODELS)
def test_gpu_greedy_generate_picks_reference_maxima(kind):
    """Greedy decoding of a left-padded batch on this backend (the prefill unpadded, then one query
    per row against the cache, past Mistral's window). bf16 logits tie often enough that token
    equality with SDPA would be flaky, so each chosen token is checked against the float32 model
    run on the generated sequence: its float32 logit is within twice the allowed bf16 error of the
    maximum (greedy took the bf16 argmax, which is within the allowed error of each float32 logit)."""
    models = gpu_models(kind)
    prompt = 24
    ids, mask = token_batch([24, 9], prompt, "left", "cuda")
    tokens = models["ours"].generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
    full_mask = torch.cat([mask, torch.ones_like(tokens[:, prompt:])], dim=1)
    with torch.no_grad():
        logits = {name: models[name](tokens, attention_mask=full_mask, position_ids=generation_positions(full_mask))
                  .logits[:, prompt - 1:-1].float() for name in ("standard", "reference")}
    allowed = 2 * (logits["standard"] - logits["reference"]).abs().max().item() + 1e-5
    chosen = logits["reference"].gather(-1, tokens[:, prompt:, None])[..., 0]
    shortfall = (logits["reference"].max(dim=-1).values - chosen).max().item()
    assert shortfall <= 2 * allowed, f"a greedy token {shortfall} below the float32 maximum (allowed {2 * allowed})"


@pytest.mark.gpu
@requires_gpu
def test_gpu_softcap_matches_eager():
    models = gpu_models("gemma2", standard="eager")
    ids, mask = token_batch([80, 37], 80, "left", "cuda")
    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits for name, model in models.items()}
    valid = mask.bool()
    assert_within_rule("logits", logits["ours"][valid], logits["reference"][valid], logits["standard"][valid])

