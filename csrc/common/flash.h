// Plain parameter structs shared by the API (csrc/api) and every kernel family: no torch, no CuTe.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

// The seed and offset of the Philox generator behind dropout (common/dropout.h), as torch's CUDA
// generator hands them out: values, or, when from_device, pointers read when the kernel runs (CUDA
// graph capture, where each replay advances them) plus offset_intragraph.
struct PhiloxSeed {
    uint64_t seed, offset;
    const int64_t *seed_ptr, *offset_ptr;
    uint64_t offset_intragraph;
    bool from_device;
};

// A side of the attention window with no bound (params window_left / window_right; common/mask.h).
inline constexpr int kWindowUnbounded = 1 << 30;

struct Flash_fwd_params {
    // Tensors in (batch, seqlen, nheads, head_dim) layout with a contiguous last dim; varlen:
    // (total tokens, nheads, head_dim), the batch strides unused.
    void *__restrict__ q_ptr;
    void *__restrict__ k_ptr;
    void *__restrict__ v_ptr;
    void *__restrict__ o_ptr;
    // (batch, nheads, seqlen_q), contiguous; varlen (nheads, total_q).
    float *__restrict__ softmax_lse_ptr;

    int64_t q_batch_stride, k_batch_stride, v_batch_stride, o_batch_stride;
    int64_t q_row_stride, k_row_stride, v_row_stride, o_row_stride;
    int64_t q_head_stride, k_head_stride, v_head_stride, o_head_stride;

    int batch;
    // Varlen: the maximum lengths of a sequence.
    int seqlen_q, seqlen_k;
    // Varlen: (batch + 1) offsets of each sequence's first token, cu_seqlens[batch] being the total
    // number of tokens (total_q, total_k); null for the padded layout.
    const int *__restrict__ cu_seqlens_q;
    const int *__restrict__ cu_seqlens_k;
    int total_q, total_k;
    // Paged K and V (flash_attn_with_kvcache's block_table; varlen only), else null: k and v hold
    // num_pages pages of page_size rows, page_stride rows apart (stored_rows_k rows in all), and
    // cu_seqlens_k and total_k count logical rows, paged_rows per row of block_table: sequence b's
    // key t, logical row b * paged_rows + t, is row t % page_size of page
    // block_table[b * block_table_stride + t / page_size]. The Hopper forward reads them
    // (sm90/paged_keys.h); its key blocks must not cross pages (page_size, page_stride and the
    // sequences' first keys multiples of its kBlockN).
    const int *__restrict__ block_table;
    int64_t block_table_stride;
    int page_size, page_stride, num_pages, paged_rows, stored_rows_k;
    int num_heads, num_heads_k;
    // The kernel's kHeadDim (flash_attn_func pads q, k, v to it) and the element type: a family
    // dispatches on them, and on is_causal, to its compiled kernels.
    int head_dim;
    bool is_bf16;

    // The attention options (api/options.h fills them, in one place). The window: query row i sees
    // key j iff -window_left <= j - (i + seqlen_k - seqlen_q) <= window_right (kWindowUnbounded: no
    // bound on that side; causal has window_right = 0).
    bool is_causal;
    int window_left, window_right;
    // softcap > 0: the scaled score s becomes softcap * tanh(s / softcap), before masks and ALiBi.
    float softcap;
    // ALiBi: -slope * |j - (i + seqlen_k - seqlen_q)| added to the (capped) scaled score. fp32 slopes,
    // slope of (batch b, head h) at alibi_slopes_ptr[b * alibi_slopes_batch_stride + h] (stride 0
    // for one slope per head); null: no ALiBi.
    const float *__restrict__ alibi_slopes_ptr;
    int alibi_slopes_batch_stride;
    float softmax_scale;
    // softmax_scale * log2(e): the kernels exponentiate with exp2.
    float softmax_scale_log2;

    // Dropout with probability p_dropout (0: off) on the normalized P (common/dropout.h), kept
    // entries scaled by dropout_scale = 1 / (1 - p). Which are kept: common/dropout_threshold.h, its
    // float16 threshold in both halves of dropout_keep_threshold, its invert as 0 or all ones.
    float p_dropout;
    uint32_t dropout_keep_threshold;
    uint32_t dropout_keep_invert;
    float dropout_scale;
    PhiloxSeed philox;
    // The forward writes the (seed, offset) it used here (int64 x 2), for the backward.
    int64_t *__restrict__ rng_state_ptr;
    // return_attn_probs with dropout: P~ = exp(S - running max) of every visited tile written here,
    // negated where dropped (flash-attn's encoding), in q's dtype, (batch, nheads, rows, cols) with
    // the strides below (rows and cols: seqlen_q and seqlen_k rounded up to 128); else null.
    void *__restrict__ s_dmask_ptr;
    int64_t s_dmask_batch_stride, s_dmask_head_stride, s_dmask_row_stride;
    // Whether the caller asked for them (set before s_dmask_ptr is, for choosing a family).
    bool return_softmax;

    // Global scratch memory of the size the serving family asked for (api/families.h,
    // fwd_workspace_bytes), allocated by the API and initialized by the family's launcher on its
    // stream; null when it asked for none.
    void *__restrict__ fwd_workspace;
};

// The backward pass reads q, k, v, o (Flash_fwd_params) and the forward's logsumexp.
struct Flash_bwd_params : Flash_fwd_params {
    // dO: (batch, seqlen_q, nheads, head_dim) with a contiguous last dim.
    void *__restrict__ do_ptr;
    int64_t do_batch_stride, do_row_stride, do_head_stride;
    // Outputs laid out like q (dq) and k (dk, dv), with a contiguous last dim: views of one packed
    // gradient, say. dk and dv have one head per query head (nheads); api/attention.cpp sums the
    // heads of a group for MQA/GQA.
    void *__restrict__ dq_ptr;
    void *__restrict__ dk_ptr;
    void *__restrict__ dv_ptr;
    int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
    int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
    int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

    // Rows of the fp32 scratch buffers below per (batch, head), seqlen_q rounded up to a multiple of
    // the backward's kBlockM; varlen: per head, at least total_q + batch * kBlockM, sequence b starting
    // at row cu_seqlens_q[b] + b * kBlockM rounded down to a multiple of kBlockM (BlockInfo::accum_row0).
    int accum_rows;
    // (batch, nheads, accum_rows * head_dim) fp32 (varlen: (nheads, accum_rows * head_dim)): dQ
    // accumulated over the KV blocks, each Q block's kBlockM * head_dim floats in the main kernel's
    // register order (dq_accum.h).
    float *__restrict__ dq_accum_ptr;
    // (batch, nheads, accum_rows) fp32 (varlen: (nheads, accum_rows)): D = rowsum(dO * O).
    float *__restrict__ softmax_d_ptr;
    // Laid out as softmax_d, where the family asked for it (BwdWorkspace::lse_log2_floats > 0):
    // softmax_lse * log2(e), +inf in the rows past each sequence. Else null.
    float *__restrict__ softmax_lse_log2_ptr;
    // (batch, nheads, ceil(seqlen_q / kBlockM), dQ partials per Q block: the Hopper backward's 1 or
    // 2, sm90/bwd_config.h; the FA2 family's 1) int32, zeroed, when the dQ accumulation must be
    // deterministic: KV block j adds into a Q block once the count there reaches j's place among
    // the KV blocks of that Q block's range (common/block_range.h). Else null.
    int *__restrict__ dq_semaphore_ptr;
    // Global scratch memory of BwdWorkspace::scratch_bytes (the Hopper backward's tile counter and,
    // varlen, its TMA descriptors per sequence), initialized by the family's launcher on its stream;
    // null when it asked for none.
    void *__restrict__ bwd_scratch;
    // Shared memory a thread block may opt in to on this GPU, in bytes: where a family has tile
    // shapes of different sizes, its launcher takes the largest that fits.
    int smem_per_block;
};

// The scratch memory a family's backward needs, which the API allocates: the sizes of the buffers
// behind dq_accum_ptr, softmax_d_ptr, softmax_lse_log2_ptr (0: none), (when deterministic)
// dq_semaphore_ptr, zeroed, and bwd_scratch (0: none).
struct BwdWorkspace {
    int accum_rows;
    int64_t dq_accum_floats;
    int64_t softmax_d_floats;
    int64_t lse_log2_floats;
    int64_t semaphore_ints;
    int64_t scratch_bytes;
};

// Softcap or ALiBi on: the families then launch their kernels with the score modification
// (common/score_mod.h) compiled in.
inline bool has_score_mod(const Flash_fwd_params &params) {
    return params.softcap > 0.f || params.alibi_slopes_ptr != nullptr;
}

inline bool has_dropout(const Flash_fwd_params &params) { return params.p_dropout > 0.f; }
