// Filling the kernels' parameter structs from checked tensors: the one place that knows both.
#pragma once

#include <ATen/core/Tensor.h>

#include "api/attention.h"
#include "api/checks.h"
#include "api/options.h"
#include "common/flash.h"

// q, k, v, out, softmax_lse laid out as Problem describes.
Flash_fwd_params fwd_params(const Problem &p, const AttentionOptions &options, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                            const at::Tensor &softmax_lse);

// The forward's tensors, dout, and the gradients' buffers (dk and dv with one head per query head);
// the workspace pointers are set by the caller once it has allocated them.
Flash_bwd_params bwd_params(const Problem &p, const AttentionOptions &options, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                            const at::Tensor &softmax_lse, const at::Tensor &dout, const at::Tensor &dq,
                            const at::Tensor &dk, const at::Tensor &dv);

// Paged k and v (mha_fwd_paged) over the checked k and v: the block table, the pages' geometry and
// the logical rows that cu_seqlens_k counts (total_k).
void set_paged_params(Flash_fwd_params &params, const PagedKv &paged, const at::Tensor &k);
