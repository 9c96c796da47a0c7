// Launches the forward kernel with the tile shape the dispatch table picks for (head dim, causal).
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "sm80/flash_fwd_kernel.h"
#include "sm80/fwd_tile_config.h"
#include "sm80/kernel_traits.h"
#include "sm80/launch.h"

namespace flash::sm80 {

template <typename Element, int kHeadDim, bool kIsCausal, bool kDropout = false>
using FwdTraitsFor = FwdKernelTraits<kHeadDim, fwd_tile_config(kHeadDim, kIsCausal, kDropout).block_m,
                                     fwd_tile_config(kHeadDim, kIsCausal, kDropout).block_n,
                                     fwd_tile_config(kHeadDim, kIsCausal, kDropout).num_warps, Element>;

// Errors (a kernel image missing for this GPU, too much shared memory) are left in
// cudaGetLastError() for the caller to report.
template <typename Traits, bool kIsCausal, bool kScoreMod, FwdDropout kDropout = FwdDropout::kOff>
void launch_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    const dim3 grid(cute::ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.num_heads);
    constexpr int kSmemSize = Traits::kSmemSize;
    auto kernel = &flash::flash_fwd_kernel<Traits, kIsCausal, kScoreMod, kDropout>;
    if (kSmemSize >= 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize) != cudaSuccess) {
        return;
    }
    kernel<<<grid, Traits::kNThreads, kSmemSize, stream>>>(params);
}

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream) {
    using Traits = FwdTraitsFor<Element, kHeadDim, kIsCausal>;
    // Dropout comes with the score modification compiled in: it costs more than their tests.
    using DropoutTraits = FwdTraitsFor<Element, kHeadDim, kIsCausal, true>;
    if (has_dropout(params)) {
        if (params.s_dmask_ptr != nullptr) {
            launch_fwd<DropoutTraits, kIsCausal, true, FwdDropout::kOnWithProbs>(params, stream);
        } else {
            launch_fwd<DropoutTraits, kIsCausal, true, FwdDropout::kOn>(params, stream);
        }
    } else if (has_score_mod(params)) {
        launch_fwd<Traits, kIsCausal, true>(params, stream);
    } else {
        launch_fwd<Traits, kIsCausal, false>(params, stream);
    }
}

}  // namespace flash::sm80
