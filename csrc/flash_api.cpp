// Checks arguments, fills the parameter structs, allocates the outputs and picks the kernel, for
// the ops of torch_ops.cpp; defines the pybind11 module flash_attn_cuda._C (what was built, the
// dispatch tables).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cutlass/numeric_types.h>

#include "flash.h"
#include "flash_api.h"
#include "bwd_tile_config.h"
#include "fwd_tile_config.h"

namespace {

// Set by setup.py from FLASH_ATTN_CUDA_ARCHS, FLASH_ATTN_HDIMS and FLASH_ATTN_DTYPES.
constexpr int kBuiltArchs[] = {FLASH_ATTN_ARCHS};

std::vector<int> built_head_dims() {
    std::vector<int> dims;
#ifdef FLASH_ATTN_HDIM_32
    dims.push_back(32);
#endif
#ifdef FLASH_ATTN_HDIM_64
    dims.push_back(64);
#endif
#ifdef FLASH_ATTN_HDIM_96
    dims.push_back(96);
#endif
#ifdef FLASH_ATTN_HDIM_128
    dims.push_back(128);
#endif
#ifdef FLASH_ATTN_HDIM_160
    dims.push_back(160);
#endif
#ifdef FLASH_ATTN_HDIM_192
    dims.push_back(192);
#endif
#ifdef FLASH_ATTN_HDIM_224
    dims.push_back(224);
#endif
#ifdef FLASH_ATTN_HDIM_256
    dims.push_back(256);
#endif
    return dims;
}

std::vector<std::string> built_dtypes() {
    std::vector<std::string> dtypes;
#ifdef FLASH_ATTN_DTYPE_FP16
    dtypes.push_back("fp16");
#endif
#ifdef FLASH_ATTN_DTYPE_BF16
    dtypes.push_back("bf16");
#endif
    return dtypes;
}

// The kernel head dim that serves a head dim (flash_attn_func pads to it).
int kernel_head_dim(int head_dim) { return (head_dim + 31) / 32 * 32; }

// Calls launch.operator()<Element, kHeadDim>() if the kernels for this dtype and head dim were
// built; false if they were not.
template <typename Element, class Launch>
bool dispatch_head_dim(int head_dim, Launch &&launch) {
    switch (head_dim) {
#define FLASH_HDIM_CASE(D)                             \
    case D:                                            \
        launch.template operator()<Element, D>(); \
        return true;
#ifdef FLASH_ATTN_HDIM_32
        FLASH_HDIM_CASE(32)
#endif
#ifdef FLASH_ATTN_HDIM_64
        FLASH_HDIM_CASE(64)
#endif
#ifdef FLASH_ATTN_HDIM_96
        FLASH_HDIM_CASE(96)
#endif
#ifdef FLASH_ATTN_HDIM_128
        FLASH_HDIM_CASE(128)
#endif
#ifdef FLASH_ATTN_HDIM_160
        FLASH_HDIM_CASE(160)
#endif
#ifdef FLASH_ATTN_HDIM_192
        FLASH_HDIM_CASE(192)
#endif
#ifdef FLASH_ATTN_HDIM_224
        FLASH_HDIM_CASE(224)
#endif
#ifdef FLASH_ATTN_HDIM_256
        FLASH_HDIM_CASE(256)
#endif
#undef FLASH_HDIM_CASE
        default:
            return false;
    }
}

template <class Launch>
bool dispatch(at::ScalarType dtype, int head_dim, Launch &&launch) {
#ifdef FLASH_ATTN_DTYPE_FP16
    if (dtype == at::kHalf) {
        return dispatch_head_dim<cutlass::half_t>(head_dim, launch);
    }
#endif
#ifdef FLASH_ATTN_DTYPE_BF16
    if (dtype == at::kBFloat16) {
        return dispatch_head_dim<cutlass::bfloat16_t>(head_dim, launch);
    }
#endif
    return false;
}

// After a launch: a clear error for a kernel that was not built, or could not start here.
void check_launch(bool launched, int head_dim, at::ScalarType dtype, int sm) {
    TORCH_CHECK(launched, "flash_attn_cuda was built without the kernels for head_dim ", head_dim, " and ", dtype,
                ": rebuild with FLASH_ATTN_HDIMS and FLASH_ATTN_DTYPES including them");
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err != cudaErrorNoKernelImageForDevice, "flash_attn_cuda has no kernel image for sm", sm,
                ": rebuild with FLASH_ATTN_CUDA_ARCHS including ", sm);
    C10_CUDA_CHECK(err);
}

// SASS built for sm_XY runs on sm_XZ with Z >= Y.
void check_device_arch(int sm) {
    TORCH_CHECK(sm >= 80, "flash_attn_cuda needs an Ampere (sm80) or newer GPU; this one is sm", sm);
    for (int arch : kBuiltArchs) {
        if (arch / 10 == sm / 10 && arch <= sm) {
            return;
        }
    }
    TORCH_CHECK(false, "flash_attn_cuda was not built for this GPU (sm", sm,
                "): rebuild with FLASH_ATTN_CUDA_ARCHS including ", sm);
}

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

// The kernels move 16 bytes at a time along a contiguous last dim.
bool vector_aligned(const at::Tensor &t) {
    if (t.stride(-1) != 1 || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) {
        return false;
    }
    for (int i = 0; i + 1 < t.dim(); ++i) {
        if (t.stride(i) % 8 != 0) {
            return false;
        }
    }
    return true;
}

// An input the kernels can read: t itself, or a contiguous copy where its data or strides are
// not vector_aligned.
at::Tensor readable(const at::Tensor &t) {
    return vector_aligned(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

// t must be laid out like q: the same dtype, device and layout (padded or varlen).
void check_qkv_like(const at::Tensor &t, const char *name, const at::Tensor &q) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), name, " must have the dtype of q (", q.scalar_type(),
                     "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == q.device(), name, " must be on the device of q (", q.device(), "), got ",
                      t.device());
    TORCH_CHECK_VALUE(t.dim() == q.dim(), name, " must have shape ",
                      q.dim() == 3 ? "(total, nheads, head_dim)" : "(batch, seqlen, nheads, head_dim)", ", got ",
                      t.sizes());
}

// An output the kernels write: laid out like q and vector_aligned.
void check_writable(const at::Tensor &t, const char *name, const at::Tensor &q) {
    check_qkv_like(t, name, q);
    TORCH_CHECK_VALUE(vector_aligned(t), name,
                      " must have a contiguous last dimension, 16-byte aligned, and strides that are multiples of 8 "
                      "elements");
}

// Checks that need no device sync: flash_attn_varlen_func checks the values (see interface.py).
void check_cu_seqlens(const at::Tensor &cu_seqlens, const char *name, const at::Tensor &q) {
    TORCH_CHECK_TYPE(cu_seqlens.scalar_type() == at::kInt, name, " must be int32, got ", cu_seqlens.scalar_type());
    TORCH_CHECK_VALUE(cu_seqlens.device() == q.device(), name, " must be on the device of q (", q.device(), "), got ",
                      cu_seqlens.device());
    TORCH_CHECK_VALUE(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1 && cu_seqlens.is_contiguous(), name,
                      " must be a contiguous 1-D tensor of length batch + 1, got shape ", cu_seqlens.sizes());
}

// Shapes and checks shared by the forward and backward entry points. Varlen: seqlen_q and
// seqlen_k are the maximum lengths, and cu_seqlens_q / cu_seqlens_k are set.
struct Problem {
    int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, sm;
    int total_q, total_k;
    const int *cu_seqlens_q, *cu_seqlens_k;
    const cudaDeviceProp *props;

    bool varlen() const { return cu_seqlens_q != nullptr; }
    // Shape of softmax_lse: (batch, nheads, seqlen_q), varlen (nheads, total_q).
    std::vector<int64_t> lse_shape() const {
        if (varlen()) {
            return {num_heads, total_q};
        }
        return {batch, num_heads, seqlen_q};
    }
};

Problem check_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double softmax_scale,
                      const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k) {
    TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                     "flash_attn_cuda supports fp16 and bf16, got ", q.scalar_type());
    TORCH_CHECK_VALUE(q.is_cuda(), "q must be a CUDA tensor");
    const bool varlen = cu_seqlens_q.has_value();
    TORCH_CHECK_VALUE(cu_seqlens_k.has_value() == varlen, "cu_seqlens_q and cu_seqlens_k go together");
    TORCH_CHECK_VALUE(q.dim() == (varlen ? 3 : 4), "q must have shape ",
                      varlen ? "(total_q, nheads, head_dim)" : "(batch, seqlen_q, nheads, head_dim)", ", got ",
                      q.sizes());
    check_qkv_like(k, "k", q);
    check_qkv_like(v, "v", q);
    Problem p{};
    p.num_heads = q.size(-2);
    p.head_dim = q.size(-1);
    p.num_heads_k = k.size(-2);
    if (varlen) {
        check_cu_seqlens(*cu_seqlens_q, "cu_seqlens_q", q);
        check_cu_seqlens(*cu_seqlens_k, "cu_seqlens_k", q);
        TORCH_CHECK_VALUE(cu_seqlens_k->numel() == cu_seqlens_q->numel(), "cu_seqlens_k must have the length of ",
                          "cu_seqlens_q (batch + 1 = ", cu_seqlens_q->numel(), "), got ", cu_seqlens_k->numel());
        // Below 2^30, so that rounding up to a block and adding a block per sequence stay in int.
        constexpr int64_t kMaxRows = int64_t(1) << 30;
        TORCH_CHECK_VALUE(max_seqlen_q >= 0 && max_seqlen_k >= 0 && max_seqlen_q < kMaxRows &&
                              max_seqlen_k < kMaxRows,
                          "max_seqlen_q and max_seqlen_k must be in [0, 2^30), got ", max_seqlen_q, " and ",
                          max_seqlen_k);
        TORCH_CHECK_VALUE(q.size(0) < kMaxRows && k.size(0) < kMaxRows, "at most 2^30 - 1 tokens");
        p.batch = cu_seqlens_q->numel() - 1;
        p.seqlen_q = max_seqlen_q;
        p.seqlen_k = max_seqlen_k;
        p.total_q = q.size(0);
        p.total_k = k.size(0);
        p.cu_seqlens_q = cu_seqlens_q->data_ptr<int>();
        p.cu_seqlens_k = cu_seqlens_k->data_ptr<int>();
        TORCH_CHECK_VALUE(k.size(2) == p.head_dim, "k must have shape (total_k, nheads_k, ", p.head_dim, "), got ",
                          k.sizes());
    } else {
        p.batch = q.size(0);
        p.seqlen_q = q.size(1);
        p.seqlen_k = k.size(1);
        TORCH_CHECK_VALUE(k.size(0) == p.batch && k.size(3) == p.head_dim, "k must have shape (", p.batch,
                          ", seqlen_k, nheads_k, ", p.head_dim, "), got ", k.sizes());
    }
    TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
    TORCH_CHECK_VALUE(p.head_dim % 32 == 0 && p.head_dim > 0 && p.head_dim <= 256,
                      "head_dim must be one of 32, 64, ..., 256 (flash_attn_func pads to the next one), got ",
                      p.head_dim);
    TORCH_CHECK_VALUE(p.num_heads_k > 0 && p.num_heads % p.num_heads_k == 0, "nheads (", p.num_heads,
                      ") must be a multiple of nheads_k (", p.num_heads_k, ")");
    TORCH_CHECK_VALUE(p.batch <= 65535 && p.num_heads <= 65535, "batch and nheads must be at most 65535");
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0, "softmax_scale must be positive, got ",
                      softmax_scale);
    p.props = at::cuda::getDeviceProperties(q.get_device());
    p.sm = p.props->major * 10 + p.props->minor;
    check_device_arch(p.sm);
    return p;
}

void set_fwd_params(Flash_fwd_params &params, const Problem &p, const at::Tensor &q, const at::Tensor &k,
                    const at::Tensor &v, const at::Tensor &out, const at::Tensor &softmax_lse, double softmax_scale) {
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
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
    params.sm = p.sm;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mha_fwd(const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
                                           const std::optional<at::Tensor> &cu_seqlens_q,
                                           const std::optional<at::Tensor> &cu_seqlens_k, int64_t max_seqlen_q,
                                           int64_t max_seqlen_k, double softmax_scale, bool causal) {
    const Problem p =
        check_problem(q_in, k_in, v_in, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    const at::Tensor q = readable(q_in), k = readable(k_in), v = readable(v_in);
    at::cuda::CUDAGuard device_guard{q.device()};

    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor softmax_lse = at::empty(p.lse_shape(), q.options().dtype(at::kFloat));
    if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) {
        return {out, softmax_lse};
    }

    Flash_fwd_params params{};
    set_fwd_params(params, p, q, k, v, out, softmax_lse, softmax_scale);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const bool launched = dispatch(q.scalar_type(), p.head_dim, [&]<typename Element, int kHeadDim>() {
        (causal ? run_mha_fwd_<Element, kHeadDim, true> : run_mha_fwd_<Element, kHeadDim, false>)(params, stream);
    });
    check_launch(launched, p.head_dim, q.scalar_type(), p.sm);
    return {out, softmax_lse};
}

// dk and dv of MQA/GQA are sums over the query heads of each group, computed per query head by the
// kernel and reduced here.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mha_bwd(
    const at::Tensor &dout_in, const at::Tensor &q_in, const at::Tensor &k_in, const at::Tensor &v_in,
    const at::Tensor &out_in, const at::Tensor &softmax_lse, const std::optional<at::Tensor> &cu_seqlens_q,
    const std::optional<at::Tensor> &cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
    bool causal, bool deterministic, const std::optional<at::Tensor> &dq_out, const std::optional<at::Tensor> &dk_out,
    const std::optional<at::Tensor> &dv_out) {
    const Problem p =
        check_problem(q_in, k_in, v_in, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    check_qkv_like(out_in, "out", q_in);
    check_qkv_like(dout_in, "dout", q_in);
    const at::Tensor q = readable(q_in), k = readable(k_in), v = readable(v_in), out = readable(out_in),
                     dout = readable(dout_in);
    TORCH_CHECK_VALUE(out.sizes() == q.sizes() && dout.sizes() == q.sizes(),
                      "out and dout must have the shape of q ", q.sizes(), ", got ", out.sizes(), " and ",
                      dout.sizes());
    TORCH_CHECK_VALUE(softmax_lse.scalar_type() == at::kFloat && softmax_lse.device() == q.device() &&
                          softmax_lse.is_contiguous() && softmax_lse.sizes() == at::IntArrayRef(p.lse_shape()),
                      "softmax_lse must be a contiguous float32 tensor of shape ", at::IntArrayRef(p.lse_shape()),
                      " on the device of q");
    at::cuda::CUDAGuard device_guard{q.device()};

    // The kernels are built from the sm80 and sm90 entries of the table (flash_bwd_launch_template.h).
    const BwdTileConfig cfg = bwd_tile_config(p.head_dim, causal, p.sm >= 90 ? 90 : 80);
    const int smem_needed = bwd_smem_bytes(cfg, p.head_dim);
    TORCH_CHECK(static_cast<size_t>(smem_needed) <= p.props->sharedMemPerBlockOptin,
                "flash_attn_cuda: the backward for head_dim ", p.head_dim, " needs ", smem_needed / 1024,
                " KB of shared memory per block; this GPU (sm", p.sm, ") allows ",
                p.props->sharedMemPerBlockOptin / 1024, " KB");

    auto output = [&](const std::optional<at::Tensor> &given, const char *name, const at::Tensor &like) {
        if (!given.has_value()) {
            return at::empty(like.sizes(), like.options());
        }
        check_writable(*given, name, q);
        TORCH_CHECK_VALUE(given->sizes() == like.sizes(), name, " must have the shape ", like.sizes(), ", got ",
                          given->sizes());
        return *given;
    };
    at::Tensor dq = output(dq_out, "dq", q);
    at::Tensor dk = output(dk_out, "dk", k);
    at::Tensor dv = output(dv_out, "dv", v);
    // The kernel writes dk and dv with one set of strides, one head per query head: straight into
    // dk and dv when they allow it, else into buffers reduced (MQA/GQA) or copied into them.
    const bool grouped = p.num_heads != p.num_heads_k;
    const bool direct = !grouped && dk.strides() == dv.strides();
    std::vector<int64_t> expanded_shape = k.sizes().vec();
    expanded_shape[k.dim() - 2] = p.num_heads;
    at::Tensor dk_expanded = direct ? dk : at::empty(expanded_shape, q.options());
    at::Tensor dv_expanded = direct ? dv : at::empty(expanded_shape, q.options());
    auto finish = [&]() -> std::tuple<at::Tensor, at::Tensor, at::Tensor> {
        if (!direct) {
            std::vector<int64_t> group_shape = k.sizes().vec();
            group_shape.insert(group_shape.end() - 1, p.num_heads / p.num_heads_k);
            at::sum_out(dk, dk_expanded.view(group_shape), -2);
            at::sum_out(dv, dv_expanded.view(group_shape), -2);
        }
        return {dq, dk, dv};
    };
    if (p.batch == 0 || p.num_heads == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) {
        // No query or no key: every gradient is zero (the empty ones trivially).
        dq.zero_();
        dk_expanded.zero_();
        dv_expanded.zero_();
        return finish();
    }

    const int m_blocks = (p.seqlen_q + cfg.block_m - 1) / cfg.block_m;
    const auto f32 = q.options().dtype(at::kFloat);
    at::Tensor dq_accum, softmax_d;
    int accum_rows;
    if (p.varlen()) {
        accum_rows = p.total_q + p.batch * cfg.block_m;
        dq_accum = at::empty({p.num_heads, accum_rows, p.head_dim}, f32);
        softmax_d = at::empty({p.num_heads, accum_rows}, f32);
    } else {
        accum_rows = m_blocks * cfg.block_m;
        dq_accum = at::empty({p.batch, p.num_heads, accum_rows, p.head_dim}, f32);
        softmax_d = at::empty({p.batch, p.num_heads, accum_rows}, f32);
    }
    at::Tensor dq_semaphore;
    if (deterministic) {
        dq_semaphore = at::zeros({p.batch, p.num_heads, m_blocks}, q.options().dtype(at::kInt));
    }

    Flash_bwd_params params{};
    set_fwd_params(params, p, q, k, v, out, softmax_lse, softmax_scale);
    const RowStrides dos = row_strides(dout), dqs = row_strides(dq), dks = row_strides(dk_expanded);
    params.do_ptr = dout.data_ptr();
    params.do_batch_stride = dos.batch;
    params.do_row_stride = dos.row;
    params.do_head_stride = dos.head;
    params.dq_ptr = dq.data_ptr();
    params.dk_ptr = dk_expanded.data_ptr();
    params.dv_ptr = dv_expanded.data_ptr();
    params.dq_batch_stride = dqs.batch;
    params.dq_row_stride = dqs.row;
    params.dq_head_stride = dqs.head;
    params.dk_batch_stride = dks.batch;
    params.dk_row_stride = dks.row;
    params.dk_head_stride = dks.head;
    params.accum_rows = accum_rows;
    params.dq_accum_ptr = dq_accum.data_ptr<float>();
    params.softmax_d_ptr = softmax_d.data_ptr<float>();
    params.dq_semaphore_ptr = deterministic ? dq_semaphore.data_ptr<int>() : nullptr;

    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    const bool launched = dispatch(q.scalar_type(), p.head_dim, [&]<typename Element, int kHeadDim>() {
        (causal ? run_mha_bwd_<Element, kHeadDim, true> : run_mha_bwd_<Element, kHeadDim, false>)(params, stream);
    });
    check_launch(launched, p.head_dim, q.scalar_type(), p.sm);
    return finish();
}

namespace {

py::tuple fwd_kernel_config(int head_dim, bool causal, int sm) {
    TORCH_CHECK_VALUE(head_dim > 0 && head_dim <= 256, "head_dim must be in [1, 256], got ", head_dim);
    const FwdTileConfig cfg = fwd_tile_config(kernel_head_dim(head_dim), causal, sm);
    return py::make_tuple(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages);
}

py::dict bwd_kernel_config(int head_dim, bool causal, int sm) {
    TORCH_CHECK_VALUE(head_dim > 0 && head_dim <= 256, "head_dim must be in [1, 256], got ", head_dim);
    const int kernel_dim = kernel_head_dim(head_dim);
    const BwdTileConfig cfg = bwd_tile_config(kernel_dim, causal, sm);
    py::dict config;
    config["block_m"] = cfg.block_m;
    config["block_n"] = cfg.block_n;
    config["num_warps"] = cfg.num_warps;
    config["atom_m_sdp"] = cfg.atom_m_sdp;
    config["atom_m_dkv"] = cfg.atom_m_dkv;
    config["atom_m_dq"] = cfg.atom_m_dq;
    config["stages_q_do"] = cfg.stages_q_do;
    config["dq_before_dk"] = cfg.dq_before_dk;
    config["smem_bytes"] = bwd_smem_bytes(cfg, kernel_dim);
    return config;
}

py::dict built_config() {
    py::dict config;
    config["archs"] = std::vector<int>(std::begin(kBuiltArchs), std::end(kBuiltArchs));
    config["head_dims"] = built_head_dims();
    config["dtypes"] = built_dtypes();
    return config;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() =
        "FlashAttention-2 kernels (CUDA, CuTe): what was built and the dispatch tables; the ops are "
        "torch.ops.flash_attn_cuda";
    m.def("fwd_kernel_config", &fwd_kernel_config,
          "(block_m, block_n, num_warps, num_stages) the forward dispatch table picks", py::arg("head_dim"),
          py::arg("causal"), py::arg("sm"));
    m.def("bwd_kernel_config", &bwd_kernel_config, "the backward dispatch table's entry, as a dict",
          py::arg("head_dim"), py::arg("causal"), py::arg("sm"));
    m.def("built_config", &built_config, "archs, head dims and dtypes this build has kernels for");
}
