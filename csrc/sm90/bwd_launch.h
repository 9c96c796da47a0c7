// Host entry of the Hopper backward: the preprocess (common/bwd_preprocess.h), the main kernel
// over the tiles (KV block, head, batch), the dQ postprocess.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include <cute/tensor.hpp>

#include "common/bwd_preprocess.h"
#include "common/flash.h"
#include "sm90/bwd_block.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_kernel.h"
#include "sm90/bwd_kernel_traits.h"
#include "sm90/bwd_params.h"

// Errors (no sm_90a image for this GPU, too much shared memory) are left in cudaGetLastError()
// for the caller to report; nothing after a failed launch is started.
template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_bwd_sm90(Flash_bwd_params &params, cudaStream_t stream) {
    using Traits = flash::sm90::BwdKernelTraits<Element, kHeadDim>;
    constexpr int kBlockM = Traits::kBlockM;
    const int m_blocks = cute::ceil_div(params.seqlen_q, kBlockM);
    const dim3 grid_pre =
        flash::bwd_preprocess_grid<Element, kHeadDim, kBlockM>(params.seqlen_q, params.batch, params.num_heads);
    flash::flash_bwd_preprocess_kernel<Element, kHeadDim, kBlockM>
        <<<grid_pre, flash::kRowKernelThreads, 0, stream>>>(params);
    if (cudaPeekAtLastError() != cudaSuccess) {
        return;
    }

    // The variants (softcap, ALiBi, dropout) in a kernel of their own: the plain one keeps its
    // exponentials under the dP^T GEMM. The deterministic kernel (dQ's adds in turn, bwd_dq.h) has
    // the variants compiled in, so that the other two keep their registers.
    auto kernel = params.dq_semaphore_ptr != nullptr
                      ? &flash::sm90::flash_bwd_sm90_kernel<Traits, kIsCausal, true, true>
                  : has_score_mod(params) || has_dropout(params)
                      ? &flash::sm90::flash_bwd_sm90_kernel<Traits, kIsCausal, true, false>
                      : &flash::sm90::flash_bwd_sm90_kernel<Traits, kIsCausal, false, false>;
    int device = 0, num_sms = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes) != cudaSuccess ||
        cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        return;
    }
    const int num_tiles = flash::sm90::bwd_num_tiles<Traits>(params);
    const bool deterministic = params.dq_semaphore_ptr != nullptr;
    const bool persistent =
        flash::sm90::sm90_bwd_persistent(kIsCausal, params.cu_seqlens_q != nullptr, deterministic);
    if (flash::sm90::sm90_bwd_dynamic_tiles(kIsCausal, deterministic) &&
        cudaMemsetAsync(params.bwd_scratch, 0, sizeof(flash::sm90::TileCounter), stream) != cudaSuccess) {
        return;
    }
    auto kp = flash::sm90::make_bwd_kernel_params<Traits>(params);
    if (params.cu_seqlens_q != nullptr) {
        kp.sequence_maps = flash::sm90::build_bwd_sequence_maps(kp, stream);
        if (cudaPeekAtLastError() != cudaSuccess) {
            return;  // without the descriptors the kernel would load through uninitialized memory
        }
    }
    kernel<<<persistent ? std::min(num_tiles, num_sms) : num_tiles, Traits::kNumThreads, Traits::kSmemBytes, stream>>>(
        kp);
    if (cudaPeekAtLastError() != cudaSuccess) {
        return;
    }

    const dim3 grid_post(m_blocks, params.num_heads, params.batch);
    flash::sm90::flash_bwd_sm90_postprocess_kernel<Traits><<<grid_post, Traits::kDqThreads, 0, stream>>>(params);
}
