// Launches the forward kernel with the tile shape the dispatch table picks for (head dim, arch).
#pragma once

#include <cute/tensor.hpp>

#include "flash.h"
#include "flash_fwd_kernel.h"
#include "fwd_tile_config.h"
#include "kernel_traits.h"

template <typename Element, int kHeadDim, bool kIsCausal, int kSm>
using FwdTraitsFor = FwdKernelTraits<kHeadDim, fwd_tile_config(kHeadDim, kIsCausal, kSm).block_m,
                                     fwd_tile_config(kHeadDim, kIsCausal, kSm).block_n,
                                     fwd_tile_config(kHeadDim, kIsCausal, kSm).num_warps, Element>;

// Errors (a kernel image missing for this GPU, too much shared memory) are left in
// cudaGetLastError() for the caller to report.
template <typename Traits, bool kIsCausal>
void launch_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    static_assert(fwd_tile_config(Traits::kHeadDim, kIsCausal, 80).num_stages == 1,
                  "the kernel's pipeline has one shared-memory buffer each for K and V");
    const dim3 grid(cute::ceil_div(params.seqlen_q, Traits::kBlockM), params.batch, params.num_heads);
    constexpr int kSmemSize = Traits::kSmemSize;
    auto kernel = &flash::flash_fwd_kernel<Traits, kIsCausal>;
    if (kSmemSize >= 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemSize) != cudaSuccess) {
        return;
    }
    kernel<<<grid, Traits::kNThreads, kSmemSize, stream>>>(params);
}

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream) {
    using Sm80Traits = FwdTraitsFor<Element, kHeadDim, kIsCausal, 80>;
    using Sm90Traits = FwdTraitsFor<Element, kHeadDim, kIsCausal, 90>;
    if constexpr (std::is_same_v<Sm80Traits, Sm90Traits>) {
        launch_fwd<Sm80Traits, kIsCausal>(params, stream);
    } else if (params.sm >= 90) {
        launch_fwd<Sm90Traits, kIsCausal>(params, stream);
    } else {
        launch_fwd<Sm80Traits, kIsCausal>(params, stream);
    }
}
