// The entry points of the ops (torch_ops.cpp): check -> allocate -> params -> dispatch to a family.
// Checked arguments in, kernels launched on the current stream, outputs allocated (or, for the
// backward, given).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "api/options.h"

struct FwdOutputs {
    at::Tensor out, softmax_lse;
    // With dropout: the (seed, offset) the backward needs, and with return_softmax the probabilities
    // (api/dropout.h); empty otherwise.
    at::Tensor rng_state, s_dmask;
};

// Padded: q (batch, seqlen_q, nheads, head_dim), k and v (batch,
// seqlen_k, nheads_k, head_dim); softmax_lse (batch, nheads, seqlen_q). Varlen (cu_seqlens_q and
// cu_seqlens_k given): q (total_q, nheads, head_dim), k and v (total_k, nheads_k, head_dim),
// sequence b being the rows [cu_seqlens[b], cu_seqlens[b + 1]), max_seqlen_q / max_seqlen_k at
// least the longest; softmax_lse (nheads, total_q). Inputs whose data or strides do not allow
// 16-byte accesses are copied first.
FwdOutputs mha_fwd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                   const AttentionOptions &options);

// Paged k and v for mha_fwd_paged (flash_attn_with_kvcache's block_table): k and v (stored rows,
// nheads_k, head_dim) hold pages of page_size rows, page_stride rows apart; cu_seqlens_k counts
// logical rows, block_table.size(1) * page_size per row of block_table (batch_table, blocks) int32,
// so that sequence b's key t, at logical row b * block_table.size(1) * page_size + t, is row
// t % page_size of page block_table[b, t / page_size]. Each varlen sequence's first key must be
// a multiple of 128 in its row's sequence (split-KV's chunks are).
struct PagedKv {
    at::Tensor block_table;
    int64_t page_size, page_stride;
};

// mha_fwd over paged k and v, read in place; none (and nothing launched) where the family that
// would serve the problem does not read pages (api/families.h), for the caller to gather them.
std::optional<FwdOutputs> mha_fwd_paged(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                        const at::Tensor &cu_seqlens_q, const at::Tensor &cu_seqlens_k,
                                        const AttentionOptions &options, const PagedKv &paged);

// Returns (dq, dk, dv) shaped like q, k, v: written into dq_out, dk_out, dv_out where given (views
// of one packed gradient, say), else newly allocated. Layouts as for mha_fwd; rng_state is the
// forward's (needed with dropout).
std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
    const at::Tensor &softmax_lse, const std::optional<at::Tensor> &cu_seqlens_q,
    const std::optional<at::Tensor> &cu_seqlens_k, const std::optional<at::Tensor> &rng_state,
    const AttentionOptions &options, const std::optional<at::Tensor> &dq_out, const std::optional<at::Tensor> &dk_out,
    const std::optional<at::Tensor> &dv_out);

// The family that would serve this forward (for tests and reports): "sm80" or "sm90".
const char *mha_fwd_family(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                           const std::optional<at::Tensor> &cu_seqlens_q,
                           const std::optional<at::Tensor> &cu_seqlens_k, const AttentionOptions &options);
