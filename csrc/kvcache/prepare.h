// flash_attn_with_kvcache's preparation on the device, before the varlen forward reads the cache
// (flash_attn_cuda/kvcache.py): the new keys and values rotated and written into the cache with q
// rotated beside them, and the cache's layout as a varlen batch (flash_attn_cuda/kvcache_layout.py
// writes the same offsets with torch for checked host values). Plain CUDA, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flash::kvcache {

// Strides in elements of a (batch or slot or block, row, head) tensor whose last dim is contiguous.
struct RowStrides {
    int64_t outer, row, head;
};

// The offsets of kvcache_layout.sequence_offsets, batch b in slot b: per batch, a sequence
// without query rows over the rows before its keys, then its keys in `splits` chunks
// (aligned to split_align, the last ones possibly empty) that each see the batch's `rows` query
// rows; one last sequence without rows up to total_rows. Lengths and left padding are clamped to
// the cache, and the key offsets made non-decreasing within [0, total_rows]. window_left >= 0 keeps
// only each batch's last window_left + 1 keys (its keys seen by one query row under a sliding
// window); -1 keeps them all. Where q is set, the
// chunks' query rows too: q (batch, rows, nheads, head_dim) of 2-byte elements, each batch's rows
// copied once per chunk into packed_q (batch * splits * rows, nheads, head_dim), contiguous.
struct LayoutParams {
    const int *seqlens;  // (batch,), or null: every batch has default_seqlen
    int default_seqlen;
    const int *leftpad;  // (batch,), or null: 0
    int batch, seqlen_new, capacity, rows_per_slot, rows, splits, split_align;
    int total_rows;
    int window_left;
    int *cu_seqlens_q, *cu_seqlens_k;  // (batch * (splits + 1) + 2,)
    const void *q;  // or null
    RowStrides q_strides;
    void *packed_q;
    int nheads, head_dim;
};

void launch_layout(const LayoutParams &p, cudaStream_t stream);

// k and v (batch, seqlen_new, nheads_k, head_dim) written at rows seqlens[b] + t of each batch's
// cache (its slot, or through block_table its pages of page_size rows), k rotated first where cos
// is set; q (batch, seqlen_q, nheads, head_dim) rotated into q_out where q_out is set. Rotation:
// the first rotary_dim features, at row positions seqlens[b] + t (q: + i where q_per_row, else
// seqlens[b]), pairs (2j, 2j + 1) interleaved or (j, j + rotary_dim / 2), in float32.
struct AppendParams {
    void *k_cache, *v_cache;
    RowStrides k_cache_strides, v_cache_strides;
    const void *k, *v;
    RowStrides k_strides, v_strides;
    const void *q;
    void *q_out;
    RowStrides q_strides, q_out_strides;
    const void *cos, *sin;  // (seqlen_ro, rotary_dim / 2), contiguous; null: no rotation
    int rotary_dim, seqlen_ro;
    bool interleaved, q_per_row;
    const int *seqlens;  // (batch,)
    const int *slots;    // (batch,), or null
    const int *block_table;
    int64_t block_table_stride;
    int page_size;  // 0: a dense cache
    int cache_outer;  // slots or blocks of the cache
    int batch, seqlen_new, seqlen_q, nheads, nheads_k, head_dim, capacity;
};

template <typename Element>
void launch_append(const AppendParams &p, cudaStream_t stream);

// The most chunks a merge takes: its kernel gives each a lane of a warp. And the largest head dim:
// a warp's loads of all of a row's features are unrolled.
constexpr int kMaxMergeSplits = 32;
constexpr int kMaxMergeHeadDim = 256;

// Split-KV's merge: out (batch * splits * rows, nheads, head_dim) and lse (nheads, batch * splits *
// rows) of the chunks (lse +inf where a chunk has no key for the row) -> merged (batch, rows, nheads,
// head_dim) at its strides and merged_lse (nheads, batch * rows), +inf where no chunk has a key.
// With alibi_slopes, chunk c's lse is first shifted by -slope * (the batch's keys after chunk c,
// from cu_seqlens_k of the layout): its rows saw ALiBi relative to the chunk's last key.
struct MergeParams {
    const void *out;
    int64_t out_row_stride, out_head_stride;
    const float *lse;
    const float *alibi_slopes;  // (nheads,) or (batch, nheads) at alibi_batch_stride; or null
    int64_t alibi_batch_stride;
    const int *cu_seqlens_k;  // (batch * (splits + 1) + 2,) with alibi_slopes
    void *merged;
    int64_t merged_batch_stride, merged_row_stride, merged_head_stride;
    float *merged_lse;
    int batch, splits, rows, nheads, head_dim;
};

template <typename Element>
void launch_merge(const MergeParams &p, cudaStream_t stream);

}  // namespace flash::kvcache
