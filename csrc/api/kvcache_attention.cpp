// The op torch.ops.flash_attn_cuda.kvcache_attention: the attention of flash_attn_with_kvcache once
// its cache is laid out as varlen sequences (flash_attn_cuda/kvcache_layout.py), in one call from
// Python: the query rows per chunk, the forward (mha_fwd, without the dispatcher and autograd of
// the fwd op), split-KV's merge and the outputs' shapes. As a dozen torch calls from Python these
// cost an eager decoding step more host time than its kernels take (benchmarks/NOTES.md, run 402).
// What it computes is _chunks_attention_torch in flash_attn_cuda/kvcache.py; its fake is in
// flash_attn_cuda/fake_ops.py.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "api/attention.h"
#include "api/kvcache.h"
#include "api/options.h"

namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// cache (slots, capacity, nheads_k, d), its slots rows_per_slot rows apart, as one (rows, nheads_k, d)
// tensor of rows (kvcache_layout.rows_view).
Tensor rows_view(const Tensor &cache, int64_t rows_per_slot) {
    TORCH_CHECK_VALUE(cache.dim() == 4 && rows_per_slot >= cache.size(1) &&
                          (cache.size(0) == 1 || cache.stride(0) == rows_per_slot * cache.stride(1)),
                      "kvcache_attention: the caches' slots must lie rows_per_slot rows apart, got strides ",
                      cache.strides(), " and rows_per_slot ", rows_per_slot);
    return cache.as_strided({(cache.size(0) - 1) * rows_per_slot + cache.size(1), cache.size(2), cache.size(3)},
                            {cache.stride(1), cache.stride(2), cache.stride(3)}, cache.storage_offset());
}

// A paged cache's pages (blocks, page_size, nheads_k, d) in the order of block_table (batch,
// blocks): (batch * blocks * page_size, nheads_k, d), each batch's keys in its own rows.
Tensor gathered_pages(const Tensor &pages, const Tensor &block_table) {
    const Tensor index = block_table.reshape({-1}).clamp(0, pages.size(0) - 1);
    return pages.index_select(0, index).view({-1, pages.size(2), pages.size(3)});
}

// q (batch, seqlen_q, nheads, d); packed_q (batch * splits * rows, row heads, d), the chunks' query
// rows where the layout kernel copied them, else none (q's rows repeated per chunk here); k_cache
// and v_cache (slots, capacity, nheads_k, d), read as rows (rows_view), or with block_table
// (batch, blocks) int32 pages (blocks, page_size, nheads_k, d) rows_per_slot rows apart, batch b's
// keys the rows of its pages in the order of its row of block_table (api/attention.h, PagedKv:
// read in place where the forward's family reads pages, else gathered); order / inverse: the
// batches' order in the layout and its inverse, or none; merge_slopes: ALiBi slopes whose chunks
// the merge shifts, or none; grouped: the rows are each KV head's group of query heads (one
// decoding row). Returns out (batch, seqlen_q, nheads, d) and, with return_lse, softmax_lse
// (batch, nheads, seqlen_q) (else an empty tensor).
std::tuple<Tensor, Tensor> kvcache_attention(const Tensor &q, const OptionalTensor &packed_q, const Tensor &k_cache,
                                             const Tensor &v_cache, const OptionalTensor &block_table,
                                             int64_t rows_per_slot, const Tensor &cu_seqlens_q,
                                             const Tensor &cu_seqlens_k, const OptionalTensor &order,
                                             const OptionalTensor &inverse, const OptionalTensor &merge_slopes,
                                             int64_t splits, bool grouped, bool return_lse,
                                             const AttentionOptions &options) {
    TORCH_CHECK_VALUE(q.dim() == 4 && splits >= 1,
                      "kvcache_attention: q must be (batch, seqlen_q, nheads, d), splits >= 1");
    const Tensor keys = rows_view(k_cache, rows_per_slot), values = rows_view(v_cache, rows_per_slot);
    const int64_t batch = q.size(0), seqlen_q = q.size(1), nheads = q.size(2), head_dim = q.size(3);
    const int64_t nheads_k = keys.size(1);
    TORCH_CHECK_VALUE(!grouped || (seqlen_q == 1 && nheads_k > 0 && nheads % nheads_k == 0),
                      "kvcache_attention: grouped rows need one query row and nheads a multiple of nheads_k");
    Tensor rows = grouped ? q.reshape({batch, nheads_k, nheads / nheads_k, head_dim}).transpose(1, 2) : q;
    if (order.has_value()) {
        rows = rows.index_select(0, *order);
    }
    const int64_t row_count = rows.size(1), row_heads = rows.size(2);
    Tensor chunk_rows;
    if (packed_q.has_value()) {
        chunk_rows = *packed_q;
    } else {
        chunk_rows = rows.unsqueeze(1)
                         .expand({batch, splits, row_count, row_heads, head_dim})
                         .reshape({batch * splits * row_count, row_heads, head_dim});
        if (chunk_rows.size(0) > 1 && chunk_rows.stride(0) == 0) {
            // One row seen by every chunk stays a broadcast view, which the Hopper family (TMA) cannot
            // describe: the forward would fall back to the FA2 family (1.6-1.7x slower, runs 385-387).
            chunk_rows = chunk_rows.contiguous();
        }
    }
    std::optional<FwdOutputs> chunks;
    if (block_table.has_value()) {
        chunks = mha_fwd_paged(chunk_rows, keys, values, cu_seqlens_q, cu_seqlens_k, options,
                               PagedKv{*block_table, k_cache.size(1), rows_per_slot});
        if (!chunks.has_value()) {
            chunks = mha_fwd(chunk_rows, gathered_pages(k_cache, *block_table), gathered_pages(v_cache, *block_table),
                             cu_seqlens_q, cu_seqlens_k, options);
        }
    } else {
        chunks = mha_fwd(chunk_rows, keys, values, cu_seqlens_q, cu_seqlens_k, options);
    }
    Tensor out = chunks->out, lse = chunks->softmax_lse;
    if (splits > 1 || grouped) {
        // Unsplit, the merge is the copy that puts a KV head's query heads back in their order
        // (weights of 1, exact), which starts under the forward where a torch copy would wait for it.
        std::tie(out, lse) = kvcache_merge(out, lse, batch, splits, grouped, merge_slopes,
                                           merge_slopes.has_value() ? OptionalTensor(cu_seqlens_k) : std::nullopt);
    } else {
        out = out.view({batch, row_count, row_heads, head_dim});
    }
    lse = lse.view({row_heads, batch, row_count});
    if (inverse.has_value()) {
        out = out.index_select(0, *inverse);
        lse = lse.index_select(1, *inverse);
    }
    if (grouped) {
        out = out.transpose(1, 2).reshape({batch, seqlen_q, nheads, head_dim});
    }
    // lse (heads of the rows, batch, rows) -> (batch, nheads, seqlen_q)
    lse = return_lse ? lse.permute({1, 0, 2}).contiguous().view({batch, nheads, seqlen_q})
                     : at::empty({0}, lse.options());
    return {out, lse};
}

constexpr size_t kNumArgs = 14;

void kvcache_attention_boxed(const c10::OperatorHandle &, c10::DispatchKeySet, torch::jit::Stack *stack) {
    const auto args = torch::jit::last(*stack, kNumArgs + AttentionOptions::kCount);
    const AttentionOptions options = AttentionOptions::from_stack(args.slice(kNumArgs));
    auto [out, lse] = kvcache_attention(
        args[0].toTensor(), args[1].toOptional<Tensor>(), args[2].toTensor(), args[3].toTensor(),
        args[4].toOptional<Tensor>(), args[5].toInt(), args[6].toTensor(), args[7].toTensor(),
        args[8].toOptional<Tensor>(), args[9].toOptional<Tensor>(), args[10].toOptional<Tensor>(), args[11].toInt(),
        args[12].toBool(), args[13].toBool(), options);
    torch::jit::drop(*stack, kNumArgs + AttentionOptions::kCount);
    torch::jit::push(*stack, std::move(out), std::move(lse));
}

// No backward (as flash_attn_with_kvcache has none): the op called again below autograd (its CUDA
// kernel, or its fake under tracing), so that the outputs need no grad.
void kvcache_attention_autograd(const c10::OperatorHandle &op, c10::DispatchKeySet, torch::jit::Stack *stack) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(stack);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flash_attn_cuda, m) {
    m.def((std::string("kvcache_attention(Tensor q, Tensor? packed_q, Tensor k_cache, Tensor v_cache, "
                       "Tensor? block_table, int rows_per_slot, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? order, Tensor? inverse, "
                       "Tensor? merge_slopes, int splits, bool grouped, bool return_lse, ") +
           AttentionOptions::kSchema + ") -> (Tensor out, Tensor softmax_lse)")
              .c_str());
}

TORCH_LIBRARY_IMPL(flash_attn_cuda, CUDA, m) {
    m.impl("kvcache_attention", torch::CppFunction::makeFromBoxedFunction<kvcache_attention_boxed>());
}

TORCH_LIBRARY_IMPL(flash_attn_cuda, Autograd, m) {
    m.impl("kvcache_attention", torch::CppFunction::makeFromBoxedFunction<kvcache_attention_autograd>());
}
