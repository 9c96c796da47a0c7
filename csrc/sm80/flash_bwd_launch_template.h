// Launches the backward pass (preprocess, main kernel, postprocess) with the tile shape the
// dispatch table picks for the head dim and the GPU's shared memory.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/bwd_preprocess.h"
#include "common/flash.h"
#include "sm80/bwd_tile_config.h"
#include "sm80/flash_bwd_kernel.h"
#include "sm80/flash_bwd_postprocess_kernel.h"
#include "sm80/kernel_traits.h"
#include "sm80/launch.h"

namespace flash::sm80 {

template <typename Element, int kHeadDim, bool kLargeSmem>
struct BwdTraitsFor {
    static constexpr BwdTileConfig kCfg = bwd_tile_config(kHeadDim, kLargeSmem);
    using type = BwdKernelTraits<kHeadDim, kCfg.block_m, kCfg.block_n, kCfg.num_warps, kCfg.atom_m_sdp,
                                 kCfg.atom_m_dkv, kCfg.atom_m_dq, kCfg.stages_q_do, kCfg.dq_before_dk, Element>;
    static_assert(type::kSmemSize == bwd_smem_bytes(kCfg, kHeadDim));
};

// Errors (a kernel image missing for this GPU, too much shared memory) are left in
// cudaGetLastError() for the caller to report; nothing after a failed launch is started.
template <typename Traits, bool kIsCausal>
void launch_bwd(Flash_bwd_params &params, cudaStream_t stream) {
    using Element = typename Traits::Element;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kBlockM = Traits::kBlockM;
    const dim3 grid_pre =
        flash::bwd_preprocess_grid<Element, kHeadDim, kBlockM>(params.seqlen_q, params.batch, params.num_heads);
    flash::flash_bwd_preprocess_kernel<Element, kHeadDim, kBlockM><<<grid_pre, flash::kRowKernelThreads, 0, stream>>>(params);
    if (cudaPeekAtLastError() != cudaSuccess) {
        return;
    }

    const dim3 grid(cute::ceil_div(params.seqlen_k, Traits::kBlockN), params.batch, params.num_heads);
    constexpr int kSmemSize = Traits::kSmemSize;
    auto kernel = &flash::flash_bwd_kernel<Traits, kIsCausal>;
    if (kSmemSize >= 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize) != cudaSuccess) {
        return;
    }
    kernel<<<grid, Traits::kNThreads, kSmemSize, stream>>>(params);
    if (cudaPeekAtLastError() != cudaSuccess) {
        return;
    }

    const dim3 grid_post(cute::ceil_div(params.seqlen_q, kBlockM), params.batch, params.num_heads);
    flash::flash_bwd_postprocess_kernel<Traits>
        <<<grid_post, Traits::kNThreads, Traits::kSmemQdOElems * sizeof(Element), stream>>>(params);
}

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_bwd_(Flash_bwd_params &params, cudaStream_t stream) {
    using Traits = typename BwdTraitsFor<Element, kHeadDim, false>::type;
    using LargeTraits = typename BwdTraitsFor<Element, kHeadDim, true>::type;
    static_assert(Traits::kBlockM == LargeTraits::kBlockM, "the dQ scratch is padded to one block_m");
    if constexpr (!std::is_same_v<Traits, LargeTraits>) {
        if (params.smem_per_block >= LargeTraits::kSmemSize) {
            launch_bwd<LargeTraits, kIsCausal>(params, stream);
            return;
        }
    }
    launch_bwd<Traits, kIsCausal>(params, stream);
}

}  // namespace flash::sm80
