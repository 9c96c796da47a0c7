"""A Hugging Face transformers Llama running its attention on flash_attn_cuda.

Builds a small Llama from a config (random weights, nothing downloaded), registers this package
with transformers, and compares the model on it with the same model on PyTorch SDPA: the logits of
a left-padded batch, and greedy generation from it. Needs a CUDA GPU, the extension built with head
dim 128 and bf16 (the defaults), and `pip install flash_attn_cuda[transformers]`.

    python examples/transformers_llama.py [--layers 4] [--prompt 200] [--new-tokens 32]
"""

import argparse
import copy
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from flash_attn_cuda.integrations.transformers import register


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=200, help="tokens in the longer prompt")
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU")

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=128, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    sdpa = sdpa.to(device="cuda", dtype=torch.bfloat16).eval()
    ours = copy.deepcopy(sdpa)
    ours.set_attn_implementation(register())  # or from_pretrained(..., attn_implementation=register())

    # Two prompts, the second a third as long, left-padded as generate() wants them.
    ids = torch.randint(1, config.vocab_size, (2, args.prompt), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, : args.prompt - args.prompt // 3] = 0
    ids = ids.masked_fill(mask == 0, 0)

    with torch.no_grad():
        logits = {name: model(ids, attention_mask=mask).logits for name, model in (("ours", ours), ("sdpa", sdpa))}
    valid = mask.bool()
    difference = (logits["ours"][valid].float() - logits["sdpa"][valid].float()).abs().max().item()
    print(f"logits of the padded batch: max |flash_attn_cuda - sdpa| = {difference:.4f} "
          f"(bf16; logits up to {logits['sdpa'][valid].abs().max().item():.2f})")

    tokens = {name: model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False)
              [:, args.prompt:] for name, model in (("ours", ours), ("sdpa", sdpa))}
    same = (tokens["ours"] == tokens["sdpa"]).float().mean().item()
    print(f"greedy generation: {same:.0%} of {tokens['ours'].numel()} tokens as sdpa's "
          f"(random weights give near ties, where bf16 rounding may pick another token)")
    print("flash_attn_cuda:", tokens["ours"][0, :12].tolist())
    print("sdpa:           ", tokens["sdpa"][0, :12].tolist())


if __name__ == "__main__":
    main()
