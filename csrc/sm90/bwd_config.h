// The Hopper backward's host-side facts (plain C++, for family.cpp and the launcher): its tile
// shape, where it serves faster than the FA2 family's, and its grid.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/flash.h"

namespace flash::sm90 {

// Query rows per step of the backward (bwd_kernel_traits.h), and so the rounding of its workspace
// rows (family.cpp); keys per tile: 64 per consumer warpgroup, or 64 shared by both where dK and dV
// are too wide for one warpgroup's registers (d > 128).
constexpr int sm90_bwd_block_m = 64;
constexpr int sm90_bwd_block_n(int head_dim) { return head_dim > 128 ? 64 : 128; }

// Whether the two consumer warpgroups split dQ's columns (each adds a partial of its own), or each
// adds its keys' share of all columns into one partial (d = 64: an MN-major wgmma operand's N must
// span whole 64-element swizzle atoms); bwd_kernel_traits.h.
constexpr bool sm90_bwd_dq_split_columns(int head_dim) { return head_dim / 2 % 64 == 0; }
constexpr int sm90_bwd_dq_partials(int head_dim) { return sm90_bwd_dq_split_columns(head_dim) ? 2 : 1; }

// Deterministic dQ: one turn counter per (batch, head, Q block, dQ partial) (bwd_dq.h).
constexpr int64_t sm90_bwd_semaphore_ints(int batch, int num_heads, int seqlen_q, int head_dim) {
    const int64_t m_blocks = (seqlen_q + sm90_bwd_block_m - 1) / sm90_bwd_block_m;
    return int64_t(batch) * num_heads * m_blocks * sm90_bwd_dq_partials(head_dim);
}

// The shortest query length per head dim at which the Hopper backward beats the FA2 family (run 269,
// benchmarks/NOTES.md: both forced, 16k tokens per batch at hidden 2048, 128-2048 rows, causal or
// not alike): at d = 64 at every length measured (1.04-1.39x from 128 rows), at d = 128 and 256 from
// 384 rows (1.02-1.12x there; 0.85-0.98x at 128-256 rows, where a tile walks too few Q blocks to pay
// for loading K and V and writing dK and dV). Below 128 rows not measured.
constexpr int sm90_bwd_min_seqlen_q(int head_dim) { return head_dim <= 64 ? 128 : 384; }

// Whether the Hopper backward pays: the rows a tile walks against the thresholds above. A window
// bounded on both sides (causal: right = 0) gives every tile at most left + right + block_n rows,
// however long the sequence (run 161: the Hopper family 4-9% faster on windows (1024, 0) and
// (256, 256) at d=64, 19-28% at d=128).
constexpr bool sm90_bwd_pays(int head_dim, bool causal, int seqlen_q, int window_left, int window_right) {
    const int right = causal ? 0 : window_right;
    if (window_left != kWindowUnbounded && right != kWindowUnbounded) {
        const int64_t rows = std::min<int64_t>(seqlen_q, int64_t(window_left) + right + sm90_bwd_block_n(head_dim));
        return rows >= sm90_bwd_min_seqlen_q(head_dim);
    }
    return seqlen_q >= sm90_bwd_min_seqlen_q(head_dim);
}

// Whether the deterministic backward pays here (runs 163-164 and 273, benchmarks/NOTES.md): where a
// tile's Q blocks start a block of keys' worth of rows after the previous tile's (causal, or a window
// bounded on the right), the KV block that adds next into a Q block reaches it a few steps after the
// one before (run 273, causal: 1.08-2.25x the FA2 family's speed); where every tile starts at Q
// block 0 (right side unbounded) they follow one step apart, waiting on each other at every step,
// and the FA2 family's deterministic backward is faster (0.68-0.98x), except at d = 128 from 4k rows
// (1.23-1.40x; 0.91-0.97x at 512-2k).
constexpr bool sm90_bwd_deterministic_pays(int head_dim, bool causal, int seqlen_q, int window_right) {
    return causal || window_right != kWindowUnbounded || (head_dim == 128 && seqlen_q >= 4096);
}

// Whether the main kernel runs one block per SM, so that a tile's K and V load and the previous
// tile's dK and dV stores overlap. Causal tiles (all costs, from one Q block to every one) are taken
// one at a time from a counter (tile_queue.h), greedily, as the hardware hands a grid of a block per
// tile to the free SMs; static rounds of them took up to 1.4x the time at 16k (run 221). Non-causal
// tiles cost about the same, or their costs repeat along each head's KV blocks, and walk the rotated
// rounds of static_tiles.h; varlen ones (as much as their sequence has rows) get a block each.
// Deterministic problems get a block per tile: a tile waits for tiles of lower index (bwd_dq.h),
// which the hardware starts first, whereas a persistent block waiting for a tile of a block not yet
// resident (SMs held by another stream's kernel) would wait for ever.
constexpr bool sm90_bwd_dynamic_tiles(bool causal, bool deterministic) { return causal && !deterministic; }
constexpr bool sm90_bwd_persistent(bool causal, bool varlen, bool deterministic) {
    return !deterministic && (causal || !varlen);
}

}  // namespace flash::sm90
