// The Hopper forward's tile shape per head dim. block_m rows of Q are split between
// block_m / 64 consumer warpgroups (wgmma's M is 64 per warpgroup); K and V come block_n rows
// at a time through num_stages shared-memory buffers each.
//
// d=64 takes 3 consumer warpgroups (the tall tiles) in the plain and the score-mod kernels: its
// softmax per key block costs as much time as its GEMMs, and two warpgroups left the tensor cores
// idle half the time (benchmarks/sm90/NOTES.md, v8). The dropout kernel keeps 2 (the short tiles):
// with Philox's state it spills at 3 warpgroups' 160 registers per thread (192 bytes). Where the
// tall tiles do not pay (sm90_fwd_tall_tiles_pay), every kernel runs on the short ones.
#pragma once

#include <cstdint>

struct Sm90FwdTileConfig {
    int block_m;     // rows of Q per tile (B_r in the paper)
    int block_n;     // rows of K/V per inner iteration (B_c): a wgmma N, so 64, 96, 128, 192 or 256
    int num_stages;  // shared-memory buffers for each of K and V
};

// Shared memory (227 KB per block) bounds the larger head dims: Q (one or two buffers,
// fwd_kernel_traits.h), 2 stages of K and of V.
constexpr Sm90FwdTileConfig sm90_fwd_tile_config(int head_dim, bool short_tiles) {
    switch (head_dim) {
        case 64:
            return {short_tiles ? 128 : 192, 128, 2};
        case 96:
        case 128:
            return {128, 128, 2};
        case 192:
            return {128, 96, 2};
        case 256:
        default:
            return {128, 64, 2};
    }
}

// Whether the tall tiles (d=64's plain and score-mod kernels) serve this problem faster than the short ones
// (benchmarks/sm90/NOTES.md, v8 and v10; benchmarks/NOTES.md, runs 188-191). Varlen: seqlen_q is the
// longest sequence's.
// - Fewer tall tiles than SMs: more, shorter tiles finish sooner (decode-like problems, 1-512
//   query rows against 1k-16k keys: 128-row tiles 12-30% faster).
// - Causal: each warpgroup visits only the KV blocks its own rows see (fwd_consumer.h), so with
//   enough of them the tall tiles pay at 512-1k rows too (1k: 6-9% faster, 512: 2% on average of
//   three noisy runs); from 2k rows on they gained 7-17% before that (run 145), whatever their count.
// - Else the tall tiles, ~10% faster per row; the rows they pad past a sequence's end (above a
//   causal one's start, tile_work.h) cost their warpgroup only its turns (non-causal 512-1k rows,
//   which fill 128-row tiles but not 192-row ones: 8-10% faster on the tall tiles, run 191).
constexpr bool sm90_fwd_tall_tiles_pay(int head_dim, bool causal, int seqlen_q, int64_t sequences, int num_sms) {
    const int tall = sm90_fwd_tile_config(head_dim, false).block_m;
    const int short_ = sm90_fwd_tile_config(head_dim, true).block_m;
    if (tall == short_) {
        return true;
    }
    const bool enough = sequences * ((seqlen_q + tall - 1) / tall) >= num_sms;
    return enough || (causal && seqlen_q >= 2048);
}

// The K and V that a group of the causal tile order shares in L2 (tile_scheduler.h): half of L2,
// and an eighth for sequences of up to 1k rows. There a group's heaviest tiles, first in its order,
// fetch its pairs' K and V from DRAM and its lighter tiles find them in L2; a forward this short is
// near its streaming bound (forward_bounds.py), so the smaller groups, which mix both kinds of tile
// in every wave, keep DRAM busier. Swept over L2/2 to L2/32 at every head dim (benchmarks/NOTES.md,
// run 347): the eighth 4-5% faster at 512 rows and 1-3% at 1k; from 2k rows on the half is best.
constexpr int64_t sm90_fwd_l2_group_bytes(int seqlen_q, int64_t l2_bytes) {
    return seqlen_q <= 1024 ? l2_bytes / 8 : l2_bytes / 2;
}

// Split-block kernels (fwd_split_blocks.h): both consumer warpgroups on one tile's rows, each over
// every other KV block, where every sequence has at most 64 rows (decoding) and the longest at
// least four of their KV blocks of keys (varlen: seqlen_q and seqlen_k are the longest sequence's).
// A tile like that is bound by how far its loads run ahead of its GEMMs, not by the tensor cores:
// 64-key blocks through four stages each of K and V (instead of 128 through two) took a decode step
// 4-13% faster, 6-21% without split-KV, and splitting the blocks between the warpgroups 0-11% more
// (benchmarks/NOTES.md, runs 373-374; on two stages of 128 keys the split alone was 10-37% slower:
// with both warpgroups holding a stage no load could run ahead). Where the short tiles have two
// consumer warpgroups and two Q buffers (through one of which the partial O goes): d <= 128.
constexpr bool sm90_fwd_supports_split_blocks(int head_dim) {
    return head_dim <= 128;
}
constexpr Sm90FwdTileConfig sm90_fwd_split_tile_config() {
    return {128, 64, 4};
}
constexpr bool sm90_fwd_split_blocks_pay(int seqlen_q, int seqlen_k) {
    return seqlen_q <= 64 && seqlen_k >= 4 * sm90_fwd_split_tile_config().block_n;
}

// Paged K and V (paged_keys.h) need every key block in one page: pages whose rows and strides are
// multiples of kSm90PageAlign, sequences whose first keys are (flash_attn_with_kvcache's split-KV
// chunks start at multiples of 128 keys, kvcache_layout.SPLIT_ALIGN), and key blocks that divide it.
constexpr int kSm90PageAlign = 128;
constexpr bool sm90_fwd_supports_pages(int head_dim, int page_size, int page_stride) {
    const bool blocks_divide = kSm90PageAlign % sm90_fwd_tile_config(head_dim, true).block_n == 0 &&
                               kSm90PageAlign % sm90_fwd_tile_config(head_dim, false).block_n == 0 &&
                               kSm90PageAlign % sm90_fwd_split_tile_config().block_n == 0;
    return blocks_divide && page_size > 0 && page_size % kSm90PageAlign == 0 && page_stride % kSm90PageAlign == 0;
}

// Dropout's Philox calls span 64 keys (common/dropout.h), which a KV block must hold whole.
constexpr bool sm90_fwd_supports_dropout(int head_dim) {
    return sm90_fwd_tile_config(head_dim, true).block_n % 64 == 0;
}
