// What the kvcache ops (kvcache.cpp) share with the rest of the API code.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

// Split-KV's merge: out (batch * splits * rows, nheads, d) and lse (nheads, its rows) float32 of the
// chunks -> merged (batch, rows, nheads, d) and its lse (nheads, batch * rows). heads_outer lays the
// merged rows out as (batch, nheads, rows, d) in memory, which is the query heads' order when the
// rows are a KV head's group of query heads. alibi_slopes and cu_seqlens_k (both or neither):
// merge_splits' alibi (flash_attn_cuda/kvcache_layout.py).
std::tuple<at::Tensor, at::Tensor> kvcache_merge(const at::Tensor &out, const at::Tensor &lse, int64_t batch,
                                                 int64_t splits, bool heads_outer,
                                                 const std::optional<at::Tensor> &alibi_slopes,
                                                 const std::optional<at::Tensor> &cu_seqlens_k);
