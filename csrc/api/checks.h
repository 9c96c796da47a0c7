// The argument checks of the ops, and the shapes they establish: every tensor check of the
// package lives here (flash_attn_cuda/checks.py keeps only what Python must do before the op: head
// dims above the largest kernel's, and the values of cu_seqlens).
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <vector>

// The SASS archs of this build (setup.py sets FLASH_ATTN_ARCHS from FLASH_ATTN_CUDA_ARCHS).
inline constexpr int kBuiltArchs[] = {FLASH_ATTN_ARCHS};

// Shapes of a checked problem. Varlen: seqlen_q and seqlen_k are the maximum lengths, and
// cu_seqlens_q / cu_seqlens_k are set.
struct Problem {
    int batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, sm;
    int total_q, total_k;
    const int *cu_seqlens_q, *cu_seqlens_k;
    const cudaDeviceProp *props;

    bool varlen() const { return cu_seqlens_q != nullptr; }
    // Shape of softmax_lse: (batch, nheads, seqlen_q), varlen (nheads, total_q).
    std::vector<int64_t> lse_shape() const;
};

// q, k, v of either layout (padded, or varlen with cu_seqlens), on a GPU this build serves.
Problem check_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                      const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k);

// Shared memory a block may opt in to on this GPU, or less under FLASH_ATTN_CUDA_SMEM_LIMIT (bytes),
// so that the tile shapes of a GPU with less (an A100's 163 KB, say) can run on a larger one. Read
// by the backward only, whose FA2 family picks its tile shape by it.
int smem_per_block(const cudaDeviceProp &props);

// t must be laid out like q: the same dtype, device and layout (padded or varlen).
void check_qkv_like(const at::Tensor &t, const char *name, const at::Tensor &q);

// An output the kernels write: laid out like q, with the shape of like, and 16-byte accessible.
void check_writable(const at::Tensor &t, const char *name, const at::Tensor &q, const at::Tensor &like);

// An input the kernels can read, which move 16 bytes at a time along a contiguous last dim: t
// itself, or a contiguous copy where its data or strides do not allow that.
at::Tensor copy_if_misaligned(const at::Tensor &t);
