#include "api/checks.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include <ATen/cuda/CUDAContext.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

namespace {

// Set by setup.py from flash_attn_cuda/head_dims.py.
constexpr int kKernelHeadDims[] = {FLASH_ATTN_KERNEL_HDIMS};
// Sequence lengths and token counts stay below it (common/mask.h compares offsets in int).
constexpr int64_t kMaxRows = int64_t(1) << 30;

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

// Checks that need no device sync: flash_attn_varlen_func checks the values (see checks.py).
void check_cu_seqlens(const at::Tensor &cu_seqlens, const char *name, const at::Tensor &q) {
    TORCH_CHECK_TYPE(cu_seqlens.scalar_type() == at::kInt, name, " must be int32, got ", cu_seqlens.scalar_type());
    TORCH_CHECK_VALUE(cu_seqlens.device() == q.device(), name, " must be on the device of q (", q.device(), "), got ",
                      cu_seqlens.device());
    TORCH_CHECK_VALUE(cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 1 && cu_seqlens.is_contiguous(), name,
                      " must be a contiguous 1-D tensor of length batch + 1, got shape ", cu_seqlens.sizes());
}

}  // namespace

std::vector<int64_t> Problem::lse_shape() const {
    if (varlen()) {
        return {num_heads, total_q};
    }
    return {batch, num_heads, seqlen_q};
}

void check_qkv_like(const at::Tensor &t, const char *name, const at::Tensor &q) {
    TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), name, " must have the dtype of q (", q.scalar_type(),
                     "), got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == q.device(), name, " must be on the device of q (", q.device(), "), got ",
                      t.device());
    TORCH_CHECK_VALUE(t.dim() == q.dim(), name, " must have shape ",
                      q.dim() == 3 ? "(total, nheads, head_dim)" : "(batch, seqlen, nheads, head_dim)", ", got ",
                      t.sizes());
}

void check_writable(const at::Tensor &t, const char *name, const at::Tensor &q, const at::Tensor &like) {
    check_qkv_like(t, name, q);
    TORCH_CHECK_VALUE(t.sizes() == like.sizes(), name, " must have the shape ", like.sizes(), ", got ", t.sizes());
    TORCH_CHECK_VALUE(vector_aligned(t), name,
                      " must have a contiguous last dimension, 16-byte aligned, and strides that are multiples of 8 "
                      "elements");
}

at::Tensor copy_if_misaligned(const at::Tensor &t) {
    return vector_aligned(t) ? t : t.clone(at::MemoryFormat::Contiguous);
}

Problem check_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                      const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k) {
    TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                     "flash_attn_cuda supports fp16 and bf16, got ", q.scalar_type());
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
        // Rounding up to a block and adding a block per sequence stay in int.
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
        // Below 2^30, as for varlen: the masks compare offsets of rows and keys in int.
        TORCH_CHECK_VALUE(q.size(1) < kMaxRows && k.size(1) < kMaxRows, "seqlen_q and seqlen_k must be below 2^30, got ",
                          q.size(1), " and ", k.size(1));
        p.batch = q.size(0);
        p.seqlen_q = q.size(1);
        p.seqlen_k = k.size(1);
        TORCH_CHECK_VALUE(k.size(0) == p.batch && k.size(3) == p.head_dim, "k must have shape (", p.batch,
                          ", seqlen_k, nheads_k, ", p.head_dim, "), got ", k.sizes());
    }
    TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v must have the shape of k ", k.sizes(), ", got ", v.sizes());
    TORCH_CHECK_VALUE(std::find(std::begin(kKernelHeadDims), std::end(kKernelHeadDims), p.head_dim) !=
                          std::end(kKernelHeadDims),
                      "head_dim must be one of ", c10::ArrayRef<int>(kKernelHeadDims),
                      " (flash_attn_func pads to the next one), got ", p.head_dim);
    TORCH_CHECK_VALUE(p.num_heads_k > 0 && p.num_heads % p.num_heads_k == 0, "nheads (", p.num_heads,
                      ") must be a multiple of nheads_k (", p.num_heads_k, ")");
    TORCH_CHECK_VALUE(p.batch <= 65535 && p.num_heads <= 65535, "batch and nheads must be at most 65535");
    // Last: the checks above hold for tensors on any device, so that they can be tested without a GPU.
    TORCH_CHECK_VALUE(q.is_cuda(), "q must be a CUDA tensor, got device ", q.device());
    p.props = at::cuda::getDeviceProperties(q.get_device());
    p.sm = p.props->major * 10 + p.props->minor;
    check_device_arch(p.sm);
    return p;
}

int smem_per_block(const cudaDeviceProp &props) {
    const int gpu = static_cast<int>(props.sharedMemPerBlockOptin);
    const char *limit = std::getenv("FLASH_ATTN_CUDA_SMEM_LIMIT");
    if (limit == nullptr || limit[0] == '\0') {
        return gpu;
    }
    char *end = nullptr;
    const long bytes = std::strtol(limit, &end, 10);
    TORCH_CHECK_VALUE(*end == '\0' && bytes > 0,
                      "FLASH_ATTN_CUDA_SMEM_LIMIT must be a positive number of bytes, got ", limit);
    return static_cast<int>(std::min<long>(bytes, gpu));
}
