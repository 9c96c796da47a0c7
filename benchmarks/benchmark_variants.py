"""Attention variants against their peers, in one process: flash_attn_cuda with a sliding window,
softcap or ALiBi against FlexAttention (torch.compile'd, the window as a block mask, softcap and
ALiBi as score_mod), ALiBi against SDPA's efficient backend with the bias as an explicit additive
mask, dropout against SDPA's flash backend with dropout (FlexAttention has none), and each against
flash_attn_cuda without the variant (variant none: the variant's cost; for window (1024, 0), none
is full causal) and with the FA2 family forced in both directions (impl flash_attn_cuda_sm80).
bf16, 16k tokens per batch, hidden 2048.

python benchmarks/benchmark_variants.py [--json] [--hdims 64,128] [--seqlens ...] [--directions fwd,bwd]
    [--variants window_1024_0,window_256_256,softcap,alibi,dropout]

Rows: {variant, impl, direction (fwd|bwd), hdim, causal, seqlen, batch, nheads, ms}; --json writes
results/variants_h100.json after every cell.
"""

import argparse
import math
import pathlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmark_attn import DTYPES, HIDDEN, TOKENS, against_record, forced_sm80, metadata, recorded_speeds, time_ms, write_result
from flash_attn_cuda import flash_attn_func
from gpu_clocks import ClockSampler

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SOFTCAP = 30.0
DROPOUT_P = 0.1
# variant: (flash_attn_cuda keyword arguments, causal)
VARIANTS = {
    "window_1024_0": ({"window_size": (1024, 0)}, True),
    "window_256_256": ({"window_size": (256, 256)}, False),
    "softcap": ({"softcap": SOFTCAP}, True),
    "alibi": ({"alibi": True}, True),
    "dropout": ({"dropout_p": DROPOUT_P}, False),
}


def alibi_slopes(nheads):
    return 2.0 ** (-8.0 * torch.arange(1, nheads + 1, device="cuda", dtype=torch.float32) / nheads)


def flex(variant, causal, seqlen, nheads):
    """FlexAttention with the variant as block mask and score_mod, compiled for this shape."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    kwargs = VARIANTS[variant][0]
    left, right = kwargs.get("window_size", (-1, 0 if causal else -1))

    def visible(b, h, q_idx, kv_idx):
        offset = kv_idx - q_idx
        keep = offset <= (right if right >= 0 else seqlen)
        return keep & (offset >= -left) if left >= 0 else keep

    block_mask = create_block_mask(visible, None, None, seqlen, seqlen, device="cuda")
    score_mod = None
    if variant == "softcap":
        def score_mod(score, b, h, q_idx, kv_idx):
            return SOFTCAP * torch.tanh(score / SOFTCAP)
    elif variant == "alibi":
        slopes = alibi_slopes(nheads)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (kv_idx - q_idx).abs()
    # A fresh compile per cell: past dynamo's recompile limit (8 shapes) flex_attention falls back to
    # its unfused eager path, which materializes the scores.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)


def sdpa_efficient_alibi(seqlen, nheads):
    """SDPA's efficient backend with ALiBi and the causal mask as one additive bias."""
    pos = torch.arange(seqlen, device="cuda")
    offset = (pos[None, :] - pos[:, None]).float()
    bias = -alibi_slopes(nheads)[:, None, None] * offset.abs()[None]
    bias = bias.masked_fill(offset[None] > 0, float("-inf")).to(torch.bfloat16)[None]

    def attend(q, k, v):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return attend


def sdpa_flash_dropout(causal):
    def attend(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=DROPOUT_P, is_causal=causal)

    return attend


def ours(variant, causal, nheads, with_variant):
    """flash_attn_cuda in the (batch, nheads, seqlen, d) layout of the peers."""
    kwargs = dict(VARIANTS[variant][0]) if with_variant else {}
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = alibi_slopes(nheads)

    def attend(q, k, v):
        return flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                               **kwargs).transpose(1, 2)

    return attend


def make_call(attend, q, k, v, direction):
    if direction == "fwd":
        return lambda: attend(q, k, v)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attend(q, k, v)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def make_call_sm80(attend, q, k, v, direction):
    """make_call with the FA2 family forced in every call it makes, the backward's included."""
    call = forced_sm80(make_call, attend, q, k, v, direction)
    return lambda: forced_sm80(call)


def variants_cell(r):
    return (r["of"], r["variant"], r["direction"], f"d={r['hdim']}", f"seqlen={r['seqlen']}")


def variants_speeds(rows):
    """{(cell, impl): 1 / ms} of the variants grid's rows, for against_record."""
    return {(variants_cell(r), r["impl"]): 1 / r["ms"] for r in rows}


def variant_peer_cell(cell):
    """The peers' cell of one of ours: the variant's own (for our `none` row too)."""
    return (cell[0], cell[0]) + cell[2:]


def save(rows, meta):
    write_result("variants_h100.json", {"meta": meta, "rows": rows})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hdims", default="64,128")
    parser.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--directions", default="fwd,bwd")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    meta = metadata()
    print(meta)
    recorded = recorded_speeds(RESULTS / "variants_h100.json", lambda data: variants_speeds(data["rows"]))
    rows = []
    cells = [(d, h, s, var) for var in args.variants.split(",") for d in args.directions.split(",")
             for h in map(int, args.hdims.split(",")) for s in map(int, args.seqlens.split(","))]
    start = time.time()
    with ClockSampler() as clocks:
        for n, (direction, hdim, seqlen, variant) in enumerate(cells, 1):
            causal = VARIANTS[variant][1]
            batch, nheads = TOKENS // seqlen, HIDDEN // hdim
            q, k, v = (torch.randn(batch, nheads, seqlen, hdim, device="cuda", dtype=DTYPES["bf16"]) for _ in range(3))
            impls = [("flash_attn_cuda", variant, lambda: ours(variant, causal, nheads, True)),
                     ("flash_attn_cuda", "none", lambda: ours(variant, causal, nheads, False)),
                     ("flash_attn_cuda_sm80", variant, lambda: ours(variant, causal, nheads, True))]
            if variant == "dropout":
                impls.append(("sdpa_flash", variant, lambda: sdpa_flash_dropout(causal)))
            else:
                impls.append(("flex", variant, lambda: flex(variant, causal, seqlen, nheads)))
            if variant == "alibi":
                impls.append(("sdpa_efficient", variant, lambda: sdpa_efficient_alibi(seqlen, nheads)))
            timings = []
            for impl, name, build in impls:
                try:
                    caller = make_call_sm80 if impl == "flash_attn_cuda_sm80" else make_call
                    ms = time_ms(caller(build(), q, k, v, direction))
                except Exception as err:  # a peer that cannot run a cell is reported, not fatal
                    timings.append(f"{impl}/{name}: {str(err).splitlines()[0][:80]}")
                    continue
                rows.append(dict(variant=name, impl=impl, direction=direction, hdim=hdim, causal=causal, seqlen=seqlen,
                                 batch=batch, nheads=nheads, ms=ms, of=variant))
                timings.append(f"{impl}/{name}={ms:.3f}ms")
            torch.cuda.empty_cache()
            print(f"[{n}/{len(cells)} {time.time() - start:.0f}s] {variant} {direction} d={hdim} seqlen={seqlen}: "
                  + " ".join(timings))
            if args.json:
                save(rows, meta)
    meta["clocks"] = clocks.summary
    print("clocks:", clocks.summary)
    if args.json:
        save(rows, meta)
    print(f"{'variant':15} {'dir':4} {'d':>4} {'seqlen':>6} {'ours ms':>8} {'x none':>7} {'x sm80':>7} {'x flex':>7} "
          f"{'x sdpa_eff':>10} {'x sdpa_fl':>9}")
    for direction, hdim, seqlen, variant in cells:
        t = {(r["impl"], r["variant"]): r["ms"] for r in rows
             if (r["direction"], r["hdim"], r["seqlen"], r["of"]) == (direction, hdim, seqlen, variant)}
        mine = t.get(("flash_attn_cuda", variant))
        ratio = lambda other: f"{other / mine:.2f}" if mine and other else "-"
        print(f"{variant:15} {direction:4} {hdim:4d} {seqlen:6d} {mine or math.nan:8.3f} "
              f"{ratio(t.get(('flash_attn_cuda', 'none'))):>7} {ratio(t.get(('flash_attn_cuda_sm80', variant))):>7} "
              f"{ratio(t.get(('flex', variant))):>7} {ratio(t.get(('sdpa_efficient', variant))):>10} "
              f"{ratio(t.get(('sdpa_flash', variant))):>9}")
    for line in against_record(variants_speeds(rows), recorded, ["flex", "sdpa_flash"], peer_cell=variant_peer_cell):
        print(line)


if __name__ == "__main__":
    main()
