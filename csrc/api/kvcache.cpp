// The ops torch.ops.flash_attn_cuda.{kvcache_layout, kvcache_append, kvcache_merge}:
// flash_attn_with_kvcache's preparation and split-KV's merge on the device in one launch each (csrc/kvcache/prepare.h), instead of the few dozen
// small torch operations it takes in Python. Their fake implementations are in
// flash_attn_cuda/fake_ops.py.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <tuple>

#include "api/kvcache.h"
#include "kvcache/prepare.h"

namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// An int32 tensor of `count` elements on `device`, contiguous, or absent.
const int *index_data(const OptionalTensor &t, int64_t count, const at::Device &device, const char *name) {
    if (!t.has_value()) {
        return nullptr;
    }
    TORCH_CHECK_VALUE(t->scalar_type() == at::kInt && t->numel() == count && t->device() == device && t->is_contiguous(),
                      name, " must be a contiguous int32 tensor of ", count, " elements on ", device);
    return t->data_ptr<int>();
}

// fn(Element{}) for the kernels' element type of dtype.
template <class Fn>
void with_element(at::ScalarType dtype, const char *op, Fn &&fn) {
    if (dtype == at::kHalf) {
        fn(__half{});
    } else {
        TORCH_CHECK_VALUE(dtype == at::kBFloat16, op, " takes fp16 or bf16");
        fn(__nv_bfloat16{});
    }
}

flash::kvcache::RowStrides row_strides(const Tensor &t, const char *name) {
    TORCH_CHECK_VALUE(t.dim() == 4 && t.stride(3) == 1, name, " must be 4-D with a contiguous last dimension");
    return {t.stride(0), t.stride(1), t.stride(2)};
}

// q_rows (batch, rows, nheads, d), fp16 or bf16: copied per chunk into packed_q (batch * splits *
// rows, nheads, d), the split forward's query rows (else packed_q is empty).
std::tuple<Tensor, Tensor, Tensor> kvcache_layout(const Tensor &like, const OptionalTensor &seqlens,
                                                  int64_t default_seqlen, const OptionalTensor &leftpad, int64_t batch,
                                                  int64_t seqlen_new, int64_t capacity, int64_t rows_per_slot,
                                                  int64_t rows, int64_t splits, int64_t split_align, int64_t total_rows,
                                                  int64_t window_left, const OptionalTensor &q_rows) {
    TORCH_CHECK_VALUE(like.is_cuda(), "kvcache_layout runs on a CUDA device");
    TORCH_CHECK_VALUE(batch >= 0 && splits >= 1 && rows >= 0 && total_rows >= 0 && total_rows < INT_MAX &&
                          batch * splits * rows < INT_MAX && batch * (splits + 1) + 2 < INT_MAX,
                      "kvcache_layout: sizes out of range");
    at::cuda::CUDAGuard guard{like.device()};
    const auto device = like.device();
    const auto options = like.options().dtype(at::kInt);
    const int64_t count = batch * (splits + 1) + 2;
    Tensor cu_q = at::empty({count}, options), cu_k = at::empty({count}, options);
    flash::kvcache::LayoutParams p{};
    p.seqlens = index_data(seqlens, batch, device, "cache_seqlens");
    p.default_seqlen = int(default_seqlen);
    p.leftpad = index_data(leftpad, batch, device, "cache_leftpad");
    p.batch = int(batch);
    p.seqlen_new = int(seqlen_new);
    p.capacity = int(capacity);
    p.rows_per_slot = int(rows_per_slot);
    p.rows = int(rows);
    p.splits = int(splits);
    p.split_align = int(split_align);
    p.total_rows = int(total_rows);
    p.window_left = int(std::clamp<int64_t>(window_left, -1, INT_MAX));
    p.cu_seqlens_q = cu_q.data_ptr<int>();
    p.cu_seqlens_k = cu_k.data_ptr<int>();
    Tensor packed_q = at::empty({0}, like.options());
    if (q_rows.has_value()) {
        TORCH_CHECK_VALUE((q_rows->scalar_type() == at::kHalf || q_rows->scalar_type() == at::kBFloat16) &&
                              q_rows->device() == device && q_rows->dim() == 4 && q_rows->size(0) == batch &&
                              q_rows->size(1) == rows,
                          "kvcache_layout: q_rows must be fp16 or bf16 (batch, rows, nheads, d) on like's device");
        packed_q = at::empty({batch * splits * rows, q_rows->size(2), q_rows->size(3)}, q_rows->options());
        p.q = q_rows->data_ptr();
        p.q_strides = row_strides(*q_rows, "q_rows");
        p.packed_q = packed_q.data_ptr();
        p.nheads = int(q_rows->size(2));
        p.head_dim = int(q_rows->size(3));
    }
    flash::kvcache::launch_layout(p, at::cuda::getCurrentCUDAStream().stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {cu_q, cu_k, packed_q};
}

Tensor kvcache_append(const Tensor &k_cache, const Tensor &v_cache, const Tensor &k, const Tensor &v, const Tensor &q,
                      const Tensor &seqlens, const OptionalTensor &slots, const OptionalTensor &block_table,
                      const OptionalTensor &cos, const OptionalTensor &sin, bool interleaved, bool q_per_row,
                      int64_t capacity) {
    TORCH_CHECK_VALUE(q.is_cuda(), "kvcache_append runs on a CUDA device");
    for (const Tensor *t : {&k_cache, &v_cache, &k, &v}) {
        TORCH_CHECK_VALUE(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                          "kvcache_append: every tensor must have q's dtype and device");
    }
    at::cuda::CUDAGuard guard{q.device()};
    const auto device = q.device();
    const int64_t batch = q.size(0), head_dim = q.size(3);
    TORCH_CHECK_VALUE(head_dim % 2 == 0 && k.size(0) == batch && k.sizes() == v.sizes() &&
                          k_cache.sizes() == v_cache.sizes() && k.size(2) == k_cache.size(2) &&
                          k.size(3) == head_dim && k_cache.size(3) == head_dim,
                      "kvcache_append: shapes do not match (an even head dim is needed)");
    flash::kvcache::AppendParams p{};
    p.k_cache = k_cache.data_ptr();
    p.v_cache = v_cache.data_ptr();
    p.k_cache_strides = row_strides(k_cache, "k_cache");
    p.v_cache_strides = row_strides(v_cache, "v_cache");
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.k_strides = row_strides(k, "k");
    p.v_strides = row_strides(v, "v");
    p.q = q.data_ptr();
    p.q_strides = row_strides(q, "q");
    Tensor q_out = at::empty({0}, q.options());
    if (cos.has_value()) {
        TORCH_CHECK_VALUE(sin.has_value() && cos->dim() == 2 && cos->sizes() == sin->sizes() && cos->is_contiguous() &&
                              sin->is_contiguous() && cos->scalar_type() == q.scalar_type() &&
                              sin->scalar_type() == q.scalar_type() && cos->device() == device &&
                              sin->device() == device && 2 * cos->size(1) <= head_dim,
                          "rotary_cos and rotary_sin must be contiguous (seqlen_ro, rotary_dim / 2) tensors of q's "
                          "dtype on its device, rotary_dim <= head_dim");
        q_out = at::empty(q.sizes(), q.options());
        p.q_out = q_out.data_ptr();
        p.q_out_strides = row_strides(q_out, "q");
        p.cos = cos->data_ptr();
        p.sin = sin->data_ptr();
        p.rotary_dim = int(2 * cos->size(1));
        p.seqlen_ro = int(cos->size(0));
    }
    p.interleaved = interleaved;
    p.q_per_row = q_per_row;
    p.seqlens = index_data(seqlens, batch, device, "cache_seqlens");
    p.slots = index_data(slots, batch, device, "cache_batch_idx");
    if (block_table.has_value()) {
        TORCH_CHECK_VALUE(block_table->scalar_type() == at::kInt && block_table->dim() == 2 &&
                              block_table->size(0) == batch && block_table->stride(1) == 1 &&
                              block_table->device() == device,
                          "block_table must be int32 (batch, max_blocks) on q's device, its rows contiguous");
        p.block_table = block_table->data_ptr<int>();
        p.block_table_stride = block_table->stride(0);
        p.page_size = int(k_cache.size(1));
    }
    p.cache_outer = int(k_cache.size(0));
    p.batch = int(batch);
    p.seqlen_new = int(k.size(1));
    p.seqlen_q = int(q.size(1));
    p.nheads = int(q.size(2));
    p.nheads_k = int(k.size(2));
    p.head_dim = int(head_dim);
    p.capacity = int(capacity);
    const auto stream = at::cuda::getCurrentCUDAStream().stream();
    with_element(q.scalar_type(), "kvcache_append",
                 [&](auto element) { flash::kvcache::launch_append<decltype(element)>(p, stream); });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return q_out;
}

}  // namespace

std::tuple<Tensor, Tensor> kvcache_merge(const Tensor &out, const Tensor &lse, int64_t batch, int64_t splits,
                                         bool heads_outer, const OptionalTensor &alibi_slopes,
                                         const OptionalTensor &cu_seqlens_k) {
    TORCH_CHECK_VALUE(out.is_cuda() && out.dim() == 3 && out.stride(2) == 1 && lse.scalar_type() == at::kFloat &&
                          lse.dim() == 2 && lse.is_contiguous() && lse.size(0) == out.size(1) &&
                          lse.size(1) == out.size(0) && batch > 0 && splits > 0 && splits <= flash::kvcache::kMaxMergeSplits &&
                          out.size(0) % (batch * splits) == 0 && out.size(2) <= flash::kvcache::kMaxMergeHeadDim,
                      "kvcache_merge: out must be (batch * splits * rows, nheads, d) and lse (nheads, its rows) float32, ",
                      "splits at most ", flash::kvcache::kMaxMergeSplits, ", d at most ", flash::kvcache::kMaxMergeHeadDim);
    at::cuda::CUDAGuard guard{out.device()};
    const int64_t rows = out.size(0) / (batch * splits);
    Tensor merged = heads_outer ? at::empty({batch, out.size(1), rows, out.size(2)}, out.options()).transpose(1, 2)
                                : at::empty({batch, rows, out.size(1), out.size(2)}, out.options());
    Tensor merged_lse = at::empty({out.size(1), batch * rows}, lse.options());
    flash::kvcache::MergeParams p{};
    p.out = out.data_ptr();
    p.out_row_stride = out.stride(0);
    p.out_head_stride = out.stride(1);
    p.lse = lse.data_ptr<float>();
    TORCH_CHECK_VALUE(alibi_slopes.has_value() == cu_seqlens_k.has_value(),
                      "kvcache_merge: alibi_slopes and cu_seqlens_k go together");
    if (alibi_slopes.has_value()) {
        const int64_t nheads = out.size(1);
        TORCH_CHECK_VALUE(alibi_slopes->scalar_type() == at::kFloat && alibi_slopes->is_contiguous() &&
                              alibi_slopes->device() == out.device() &&
                              (alibi_slopes->sizes() == at::IntArrayRef{nheads} ||
                               alibi_slopes->sizes() == at::IntArrayRef{batch, nheads}),
                          "kvcache_merge: alibi_slopes must be contiguous float32 (nheads,) or (batch, nheads)");
        p.alibi_slopes = alibi_slopes->data_ptr<float>();
        p.alibi_batch_stride = alibi_slopes->dim() == 2 ? nheads : 0;
        p.cu_seqlens_k = index_data(cu_seqlens_k, batch * (splits + 1) + 2, out.device(), "cu_seqlens_k");
    }
    p.merged = merged.data_ptr();
    p.merged_batch_stride = merged.stride(0);
    p.merged_row_stride = merged.stride(1);
    p.merged_head_stride = merged.stride(2);
    p.merged_lse = merged_lse.data_ptr<float>();
    p.batch = int(batch);
    p.splits = int(splits);
    p.rows = int(rows);
    p.nheads = int(out.size(1));
    p.head_dim = int(out.size(2));
    const auto stream = at::cuda::getCurrentCUDAStream().stream();
    with_element(out.scalar_type(), "kvcache_merge",
                 [&](auto element) { flash::kvcache::launch_merge<decltype(element)>(p, stream); });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {merged, merged_lse};
}

TORCH_LIBRARY_FRAGMENT(flash_attn_cuda, m) {
    m.def("kvcache_layout(Tensor like, Tensor? seqlens, int default_seqlen, Tensor? leftpad, int batch, "
          "int seqlen_new, int capacity, int rows_per_slot, int rows, int splits, int split_align, int total_rows, "
          "int window_left, Tensor? q_rows) -> (Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor packed_q)");
    m.def("kvcache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor q, Tensor seqlens, "
          "Tensor? slots, Tensor? block_table, Tensor? cos, Tensor? sin, bool interleaved, bool q_per_row, "
          "int capacity) -> Tensor q_rotated");
    m.def("kvcache_merge(Tensor out, Tensor lse, int batch, int splits, bool heads_outer, Tensor? alibi_slopes, "
          "Tensor? cu_seqlens_k) -> (Tensor merged, Tensor merged_lse)");
}

TORCH_LIBRARY_IMPL(flash_attn_cuda, CUDA, m) {
    m.impl("kvcache_layout", kvcache_layout);
    m.impl("kvcache_append", kvcache_append);
    m.impl("kvcache_merge", kvcache_merge);
}
