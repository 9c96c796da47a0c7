#include "api/params.h"

namespace {

// The batch, row and head strides of a (batch, seqlen, nheads, head_dim) tensor, or of a varlen
// (total, nheads, head_dim) one (which has no batch stride).
struct RowStrides {
    int64_t batch, row, head;
};

RowStrides row_strides(const at::Tensor &t) {
    if (t.dim() == 3) {
        return {0, t.stride(0), t.stride(1)};
    }
    return {t.stride(0), t.stride(1), t.stride(2)};
}

void set_fwd_params(Flash_fwd_params &params, const Problem &p, const AttentionOptions &options,
                    const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                    const at::Tensor &softmax_lse) {
    params.q_ptr = q.data_ptr();
    params.k_ptr = k.data_ptr();
    params.v_ptr = v.data_ptr();
    params.o_ptr = out.data_ptr();
    params.softmax_lse_ptr = softmax_lse.data_ptr<float>();
    const RowStrides qs = row_strides(q), ks = row_strides(k), vs = row_strides(v), os = row_strides(out);
    params.q_batch_stride = qs.batch;
    params.k_batch_stride = ks.batch;
    params.v_batch_stride = vs.batch;
    params.o_batch_stride = os.batch;
    params.q_row_stride = qs.row;
    params.k_row_stride = ks.row;
    params.v_row_stride = vs.row;
    params.o_row_stride = os.row;
    params.q_head_stride = qs.head;
    params.k_head_stride = ks.head;
    params.v_head_stride = vs.head;
    params.o_head_stride = os.head;
    params.batch = p.batch;
    params.seqlen_q = p.seqlen_q;
    params.seqlen_k = p.seqlen_k;
    params.cu_seqlens_q = p.cu_seqlens_q;
    params.cu_seqlens_k = p.cu_seqlens_k;
    params.total_q = p.total_q;
    params.total_k = p.total_k;
    params.num_heads = p.num_heads;
    params.num_heads_k = p.num_heads_k;
    params.head_dim = p.head_dim;
    params.is_bf16 = q.scalar_type() == at::kBFloat16;
    options.set_params(params, q);
    // One query row sees every key under the bottom-right-aligned causal mask: the non-causal
    // kernels do the same with less work (as flash-attn does).
    if (p.seqlen_q == 1 && params.is_causal) {
        params.is_causal = false;
        params.window_right = kWindowUnbounded;
    }
}

}  // namespace

Flash_fwd_params fwd_params(const Problem &p, const AttentionOptions &options, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                            const at::Tensor &softmax_lse) {
    Flash_fwd_params params{};
    set_fwd_params(params, p, options, q, k, v, out, softmax_lse);
    return params;
}

Flash_bwd_params bwd_params(const Problem &p, const AttentionOptions &options, const at::Tensor &q,
                            const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                            const at::Tensor &softmax_lse, const at::Tensor &dout, const at::Tensor &dq,
                            const at::Tensor &dk, const at::Tensor &dv) {
    Flash_bwd_params params{};
    set_fwd_params(params, p, options, q, k, v, out, softmax_lse);
    const RowStrides dos = row_strides(dout), dqs = row_strides(dq), dks = row_strides(dk), dvs = row_strides(dv);
    params.do_ptr = dout.data_ptr();
    params.do_batch_stride = dos.batch;
    params.do_row_stride = dos.row;
    params.do_head_stride = dos.head;
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk.data_ptr();
    params.dv_ptr = dv.data_ptr();
    params.dq_batch_stride = dqs.batch;
    params.dq_row_stride = dqs.row;
    params.dq_head_stride = dqs.head;
    params.dk_batch_stride = dks.batch;
    params.dk_row_stride = dks.row;
    params.dk_head_stride = dks.head;
    params.dv_batch_stride = dvs.batch;
    params.dv_row_stride = dvs.row;
    params.dv_head_stride = dvs.head;
    params.smem_per_block = smem_per_block(*p.props);
    return params;
}

void set_paged_params(Flash_fwd_params &params, const PagedKv &paged, const at::Tensor &k) {
    const at::Tensor &table = paged.block_table;
    TORCH_CHECK_VALUE(table.scalar_type() == at::kInt && table.dim() == 2 && table.device() == k.device() &&
                          table.size(0) > 0 && table.size(1) > 0 && (table.size(1) == 1 || table.stride(1) == 1),
                      "block_table must be a non-empty (batch, blocks) int32 tensor with contiguous rows on the "
                      "device of k, got ", table.sizes(), " ", table.scalar_type());
    TORCH_CHECK_VALUE(paged.page_size > 0 && paged.page_stride >= paged.page_size && k.size(0) >= paged.page_size,
                      "pages of ", paged.page_size, " rows, ", paged.page_stride, " apart, do not fit k's ", k.size(0),
                      " rows");
    const int64_t paged_rows = table.size(1) * paged.page_size;
    // Below 2^30, as the varlen offsets (api/checks.cpp).
    TORCH_CHECK_VALUE(table.size(0) * paged_rows < (int64_t(1) << 30), "at most 2^30 - 1 rows in the block table's ",
                      "sequences, got ", table.size(0), " x ", paged_rows);
    params.block_table = table.data_ptr<int>();
    params.block_table_stride = table.stride(0);
    params.page_size = paged.page_size;
    params.page_stride = paged.page_stride;
    params.num_pages = (k.size(0) - paged.page_size) / paged.page_stride + 1;
    params.paged_rows = paged_rows;
    params.stored_rows_k = k.size(0);
    params.total_k = table.size(0) * paged_rows;
}
