#include "api/attention.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <vector>

#include "api/checks.h"
#include "api/dropout.h"
#include "api/families.h"
#include "api/params.h"
#include "sm80/family.h"

namespace {

// After a launch: a clear error for a kernel that was not built, or could not start here.
void check_launch(bool launched, const Problem &p, at::ScalarType dtype) {
    TORCH_CHECK(launched, "flash_attn_cuda was built without the kernels for head_dim ", p.head_dim, " and ", dtype,
                ": rebuild with FLASH_ATTN_HDIMS and FLASH_ATTN_DTYPES including them");
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err != cudaErrorNoKernelImageForDevice, "flash_attn_cuda has no kernel image for sm", p.sm,
                ": rebuild with FLASH_ATTN_CUDA_ARCHS including ", p.sm);
    C10_CUDA_CHECK(err);
}

Problem checked_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                        const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                        const AttentionOptions &options) {
    return check_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, options.max_seqlen_q.expect_int(),
                         options.max_seqlen_k.expect_int());
}

// No query row: none in the grid, or (varlen) none in q, whatever max_seqlen_q says.
bool empty_problem(const Problem &p) {
    return p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0 || (p.varlen() && p.total_q == 0);
}

// mha_fwd, and with paged set mha_fwd_paged.
std::optional<FwdOutputs> forward(const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
                                  const std::optional<at::Tensor> &cu_seqlens_q,
                                  const std::optional<at::Tensor> &cu_seqlens_k, const AttentionOptions &options,
                                  const PagedKv *paged) {
    const Problem p = checked_problem(q_in, k_in, v_in, cu_seqlens_q, cu_seqlens_k, options);
    const at::Tensor q = copy_if_misaligned(q_in), k = copy_if_misaligned(k_in), v = copy_if_misaligned(v_in);
    at::cuda::CUDAGuard device_guard{q.device()};

    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor softmax_lse = at::empty(p.lse_shape(), q.options().dtype(at::kFloat));
    Flash_fwd_params params = fwd_params(p, options, q, k, v, out, softmax_lse);
    if (paged != nullptr) {
        set_paged_params(params, *paged, k);
    }
    FwdDropoutTensors dropout = set_fwd_dropout(params, p, options, q);
    if (empty_problem(p)) {
        // Varlen with max_seqlen_q 0 can still have rows where the host could not check the
        // offsets (torch.compile, graph capture): they see no key.
        out.zero_();
        softmax_lse.fill_(INFINITY);
        return FwdOutputs{out, softmax_lse, dropout.rng_state, dropout.s_dmask};
    }
    const Family family = fwd_family(params, p.sm);
    if (paged != nullptr && !reads_pages(family)) {
        return std::nullopt;
    }
    // Freed on return: the caching allocator hands it out again only in stream order after the kernel.
    at::Tensor workspace;
    if (const size_t bytes = fwd_workspace_bytes(family, params); bytes > 0) {
        workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
        params.fwd_workspace = workspace.data_ptr();
    }
    check_launch(run_fwd(family, params, at::cuda::getCurrentCUDAStream().stream()), p, q.scalar_type());
    return FwdOutputs{out, softmax_lse, dropout.rng_state, dropout.s_dmask};
}

}  // namespace

FwdOutputs mha_fwd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                   const AttentionOptions &options) {
    return *forward(q, k, v, cu_seqlens_q, cu_seqlens_k, options, nullptr);
}

std::optional<FwdOutputs> mha_fwd_paged(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                        const at::Tensor &cu_seqlens_q, const at::Tensor &cu_seqlens_k,
                                        const AttentionOptions &options, const PagedKv &paged) {
    return forward(q, k, v, cu_seqlens_q, cu_seqlens_k, options, &paged);
}

const char *mha_fwd_family(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                           const std::optional<at::Tensor> &cu_seqlens_q,
                           const std::optional<at::Tensor> &cu_seqlens_k, const AttentionOptions &options) {
    const Problem p = checked_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, options);
    // As mha_fwd sees them. Only the layouts are read: q stands for out, which mha_fwd allocates like it.
    const at::Tensor q_read = copy_if_misaligned(q);
    const at::Tensor softmax_lse = at::empty({0}, q.options().dtype(at::kFloat));
    return family_name(fwd_family(
        fwd_params(p, options, q_read, copy_if_misaligned(k), copy_if_misaligned(v), q_read, softmax_lse), p.sm));
}

// The backward runs on the family bwd_family picks. dk and dv of MQA/GQA are sums over the query
// heads of each group, computed per query head by the kernels and reduced here.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor &dout_in, const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
    const at::Tensor &out_in, const at::Tensor &softmax_lse, const std::optional<at::Tensor> &cu_seqlens_q,
    const std::optional<at::Tensor> &cu_seqlens_k, const std::optional<at::Tensor> &rng_state,
    const AttentionOptions &options, const std::optional<at::Tensor> &dq_out, const std::optional<at::Tensor> &dk_out,
    const std::optional<at::Tensor> &dv_out) {
    const Problem p = checked_problem(q_in, k_in, v_in, cu_seqlens_q, cu_seqlens_k, options);
    check_qkv_like(out_in, "out", q_in);
    check_qkv_like(dout_in, "dout", q_in);
    const at::Tensor q = copy_if_misaligned(q_in), k = copy_if_misaligned(k_in), v = copy_if_misaligned(v_in),
                     out = copy_if_misaligned(out_in), dout = copy_if_misaligned(dout_in);
    TORCH_CHECK_VALUE(out.sizes() == q.sizes() && dout.sizes() == q.sizes(),
                      "out and dout must have the shape of q ", q.sizes(), ", got ", out.sizes(), " and ",
                      dout.sizes());
    TORCH_CHECK_VALUE(softmax_lse.scalar_type() == at::kFloat && softmax_lse.device() == q.device() &&
                          softmax_lse.is_contiguous() && softmax_lse.sizes() == at::IntArrayRef(p.lse_shape()),
                      "softmax_lse must be a contiguous float32 tensor of shape ", at::IntArrayRef(p.lse_shape()),
                      " on the device of q");
    at::cuda::CUDAGuard device_guard{q.device()};

    auto output = [&](const std::optional<at::Tensor> &given, const char *name, const at::Tensor &like) {
        if (!given.has_value()) {
            return at::empty(like.sizes(), like.options());
        }
        check_writable(*given, name, q, like);
        return *given;
    };
    at::Tensor dq = output(dq_out, "dq", q);
    at::Tensor dk = output(dk_out, "dk", k);
    at::Tensor dv = output(dv_out, "dv", v);
    // The kernel writes dk and dv with one head per query head: straight into dk and dv without
    // MQA/GQA, else into buffers whose groups are summed into them.
    const bool grouped = p.num_heads != p.num_heads_k;
    std::vector<int64_t> expanded_shape = k.sizes().vec();
    expanded_shape[k.dim() - 2] = p.num_heads;
    at::Tensor dk_expanded = grouped ? at::empty(expanded_shape, q.options()) : dk;
    at::Tensor dv_expanded = grouped ? at::empty(expanded_shape, q.options()) : dv;
    auto finish = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
        if (grouped) {
            std::vector<int64_t> group_shape = k.sizes().vec();
            group_shape.insert(group_shape.end() - 1, p.num_heads / p.num_heads_k);
            at::sum_out(dk, dk_expanded.view(group_shape), -2);
            at::sum_out(dv, dv_expanded.view(group_shape), -2);
        }
        return {dq, dk, dv};
    };
    if (empty_problem(p) || p.seqlen_k == 0) {
        // No query or no key: every gradient is zero (the empty ones trivially).
        dq.zero_();
        dk_expanded.zero_();
        dv_expanded.zero_();
        return finish();
    }

    Flash_bwd_params params = bwd_params(p, options, q, k, v, out, softmax_lse, dout, dq, dk_expanded, dv_expanded);
    set_bwd_dropout(params, rng_state, q);
    const Family family = bwd_family(params, p.sm, options.deterministic);
    if (family == Family::kSm80) {
        const int smem_needed = flash::sm80::bwd_smem_bytes(p.head_dim);
        TORCH_CHECK(smem_needed <= params.smem_per_block,
                    "flash_attn_cuda: the backward for head_dim ", p.head_dim, " needs ", smem_needed / 1024,
                    " KB of shared memory per block; this GPU (sm", p.sm, ") allows ",
                    params.smem_per_block / 1024, " KB");
    }
    const BwdWorkspace ws = bwd_workspace(family, params, options.deterministic);
    const auto f32 = q.options().dtype(at::kFloat);
    const at::Tensor dq_accum = at::empty({ws.dq_accum_floats}, f32);
    const at::Tensor softmax_d = at::empty({ws.softmax_d_floats}, f32);
    at::Tensor lse_log2, dq_semaphore, scratch;
    if (ws.lse_log2_floats > 0) {
        lse_log2 = at::empty({ws.lse_log2_floats}, f32);
    }
    if (ws.semaphore_ints > 0) {
        dq_semaphore = at::zeros({ws.semaphore_ints}, q.options().dtype(at::kInt));
    }
    if (ws.scratch_bytes > 0) {
        scratch = at::empty({ws.scratch_bytes}, q.options().dtype(at::kByte));
    }
    params.accum_rows = ws.accum_rows;
    params.dq_accum_ptr = dq_accum.data_ptr<float>();
    params.softmax_d_ptr = softmax_d.data_ptr<float>();
    params.softmax_lse_log2_ptr = lse_log2.defined() ? lse_log2.data_ptr<float>() : nullptr;
    params.dq_semaphore_ptr = dq_semaphore.defined() ? dq_semaphore.data_ptr<int>() : nullptr;
    params.bwd_scratch = scratch.defined() ? scratch.data_ptr() : nullptr;

    check_launch(run_bwd(family, params, at::cuda::getCurrentCUDAStream().stream()), p, q.scalar_type());
    return finish();
}
