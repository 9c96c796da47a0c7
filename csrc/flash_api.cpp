// The only file that includes torch: checks arguments, fills Flash_fwd_params, allocates the
// outputs, picks the kernel, and defines the pybind11 module flash_attn_cuda._C.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <string>
#include <vector>

#include <cutlass/numeric_types.h>

#include "flash.h"
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

int kernel_head_dim(int head_dim) { return (head_dim + 31) / 32 * 32; }

#define FLASH_FWD_HDIM_CASE(D)                                                                          \
    case D:                                                                                             \
        (causal ? run_mha_fwd_<Element, D, true> : run_mha_fwd_<Element, D, false>)(params, stream); \
        return true;

// Launches the kernel for this head dim if it was built; false if it was not.
template <typename Element>
bool run_fwd_for_dtype(Flash_fwd_params &params, bool causal, cudaStream_t stream) {
    switch (kernel_head_dim(params.head_dim)) {
#ifdef FLASH_ATTN_HDIM_32
        FLASH_FWD_HDIM_CASE(32)
#endif
#ifdef FLASH_ATTN_HDIM_64
        FLASH_FWD_HDIM_CASE(64)
#endif
#ifdef FLASH_ATTN_HDIM_96
        FLASH_FWD_HDIM_CASE(96)
#endif
#ifdef FLASH_ATTN_HDIM_128
        FLASH_FWD_HDIM_CASE(128)
#endif
#ifdef FLASH_ATTN_HDIM_160
        FLASH_FWD_HDIM_CASE(160)
#endif
#ifdef FLASH_ATTN_HDIM_192
        FLASH_FWD_HDIM_CASE(192)
#endif
#ifdef FLASH_ATTN_HDIM_224
        FLASH_FWD_HDIM_CASE(224)
#endif
#ifdef FLASH_ATTN_HDIM_256
        FLASH_FWD_HDIM_CASE(256)
#endif
        default:
            return false;
    }
}

bool run_fwd(Flash_fwd_params &params, at::ScalarType dtype, bool causal, cudaStream_t stream) {
#ifdef FLASH_ATTN_DTYPE_FP16
    if (dtype == at::kHalf) {
        return run_fwd_for_dtype<cutlass::half_t>(params, causal, stream);
    }
#endif
#ifdef FLASH_ATTN_DTYPE_BF16
    if (dtype == at::kBFloat16) {
        return run_fwd_for_dtype<cutlass::bfloat16_t>(params, causal, stream);
    }
#endif
    return false;
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

void check_qkv_like(const at::Tensor &t, const char *name, const at::Tensor &q) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), name, " must have the dtype of q (", q.scalar_type(),
                     "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == q.device(), name, " must be on the device of q (", q.device(), "), got ",
                      t.device());
    TORCH_CHECK_VALUE(t.dim() == 4, name, " must have shape (batch, seqlen, nheads, head_dim), got ", t.sizes());
    TORCH_CHECK_VALUE(t.stride(-1) == 1, name, " must have a contiguous last dimension");
    // 16-byte vector loads and stores.
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
                          t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0,
                      name, " must be 16-byte aligned with strides that are multiples of 8 elements");
}

std::vector<at::Tensor> fwd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            std::optional<at::Tensor> out_, double softmax_scale, bool causal) {
    TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                     "flash_attn_cuda supports fp16 and bf16, got ", q.scalar_type());
    TORCH_CHECK_VALUE(q.is_cuda(), "q must be a CUDA tensor");
    check_qkv_like(q, "q", q);
    check_qkv_like(k, "k", q);
    check_qkv_like(v, "v", q);

    const int batch = q.size(0), seqlen_q = q.size(1), num_heads = q.size(2), head_dim = q.size(3);
    const int seqlen_k = k.size(1), num_heads_k = k.size(2);
    TORCH_CHECK_VALUE(k.size(0) == batch && k.size(3) == head_dim, "k must have shape (", batch,
                      ", seqlen_k, nheads_k, ", head_dim, "), got ", k.sizes());
    TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
    TORCH_CHECK_VALUE(head_dim % 8 == 0 && head_dim <= 256,
                      "head_dim must be a multiple of 8 and at most 256 (flash_attn_func pads), got ", head_dim);
    TORCH_CHECK_VALUE(num_heads_k > 0 && num_heads % num_heads_k == 0, "nheads (", num_heads,
                      ") must be a multiple of nheads_k (", num_heads_k, ")");
    TORCH_CHECK_VALUE(batch <= 65535 && num_heads <= 65535, "batch and nheads must be at most 65535");
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0, "softmax_scale must be positive, got ",
                      softmax_scale);

    at::cuda::CUDAGuard device_guard{q.device()};
    const auto *props = at::cuda::getCurrentDeviceProperties();
    const int sm = props->major * 10 + props->minor;
    check_device_arch(sm);

    at::Tensor out;
    if (out_.has_value()) {
        out = out_.value();
        check_qkv_like(out, "out", q);
        TORCH_CHECK_VALUE(out.sizes() == q.sizes(), "out must have the shape of q ", q.sizes(), ", got ",
                          out.sizes());
    } else {
        out = at::empty(q.sizes(), q.options());
    }
    at::Tensor softmax_lse = at::empty({batch, num_heads, seqlen_q}, q.options().dtype(at::kFloat));
    if (batch == 0 || seqlen_q == 0 || num_heads == 0) {
        return {out, softmax_lse};
    }

    Flash_fwd_params params{};
    params.q_ptr = q.data_ptr();
    params.k_ptr = k.data_ptr();
    params.v_ptr = v.data_ptr();
    params.o_ptr = out.data_ptr();
    params.softmax_lse_ptr = softmax_lse.data_ptr<float>();
    params.q_batch_stride = q.stride(0);
    params.k_batch_stride = k.stride(0);
    params.v_batch_stride = v.stride(0);
    params.o_batch_stride = out.stride(0);
    params.q_row_stride = q.stride(1);
    params.k_row_stride = k.stride(1);
    params.v_row_stride = v.stride(1);
    params.o_row_stride = out.stride(1);
    params.q_head_stride = q.stride(2);
    params.k_head_stride = k.stride(2);
    params.v_head_stride = v.stride(2);
    params.o_head_stride = out.stride(2);
    params.batch = batch;
    params.seqlen_q = seqlen_q;
    params.seqlen_k = seqlen_k;
    params.num_heads = num_heads;
    params.num_heads_k = num_heads_k;
    params.head_dim = head_dim;
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
    params.sm = sm;

    const bool launched = run_fwd(params, q.scalar_type(), causal, at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(launched, "flash_attn_cuda was built without the kernel for head_dim ", kernel_head_dim(head_dim),
                " and ", q.scalar_type(), ": rebuild with FLASH_ATTN_HDIMS and FLASH_ATTN_DTYPES including them");
    const cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err != cudaErrorNoKernelImageForDevice, "flash_attn_cuda has no kernel image for sm", sm,
                ": rebuild with FLASH_ATTN_CUDA_ARCHS including ", sm);
    C10_CUDA_CHECK(err);
    return {out, softmax_lse};
}

py::tuple fwd_kernel_config(int head_dim, bool causal, int sm) {
    TORCH_CHECK_VALUE(head_dim > 0 && head_dim <= 256, "head_dim must be in [1, 256], got ", head_dim);
    const FwdTileConfig cfg = fwd_tile_config(kernel_head_dim(head_dim), causal, sm);
    return py::make_tuple(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages);
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
    m.doc() = "FlashAttention-2 kernels (CUDA, CuTe)";
    m.def("fwd", &fwd, "FlashAttention-2 forward: returns [out, softmax_lse]", py::arg("q"), py::arg("k"),
          py::arg("v"), py::arg("out") = py::none(), py::arg("softmax_scale"), py::arg("causal"));
    m.def("fwd_kernel_config", &fwd_kernel_config,
          "(block_m, block_n, num_warps, num_stages) the dispatch table picks", py::arg("head_dim"),
          py::arg("causal"), py::arg("sm"));
    m.def("built_config", &built_config, "archs, head dims and dtypes this build has kernels for");
}
