// Host entry of the Hopper forward: TMA descriptors from the parameters, then one persistent
// block per SM (fewer when there are fewer tiles), launched dependent on the kernel before it (the
// varlen descriptors' kernel), so that its blocks set up while that one runs.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include "common/dependent_launch.h"
#include "common/flash.h"
#include "sm90/fwd_kernel.h"
#include "sm90/fwd_kernel_traits.h"
#include "sm90/fwd_params.h"
#include "sm90/fwd_tile_config.h"
#include "sm90/workspace.h"

// kShortTiles: the dropout kernel's tiles, which the others take where the tall ones do not pay
// (fwd_tile_config.h).
template <typename Element, int kHeadDim, bool kIsCausal, bool kShortTiles>
using Sm90FwdTraitsFor =
    flash::sm90::FwdKernelTraits<Element, kHeadDim, sm90_fwd_tile_config(kHeadDim, kShortTiles).block_m,
                                 sm90_fwd_tile_config(kHeadDim, kShortTiles).block_n,
                                 sm90_fwd_tile_config(kHeadDim, kShortTiles).num_stages,
                                 flash::sm90::dynamic_tiles(kIsCausal)>;

// The split-block kernels' traits (fwd_split_blocks.h).
template <typename Element, int kHeadDim, bool kIsCausal>
using Sm90FwdSplitTraitsFor =
    flash::sm90::FwdKernelTraits<Element, kHeadDim, sm90_fwd_split_tile_config().block_m,
                                 sm90_fwd_split_tile_config().block_n, sm90_fwd_split_tile_config().num_stages,
                                 flash::sm90::dynamic_tiles(kIsCausal), /*kSplitBlocks=*/true>;

template <class Traits, bool kIsCausal, bool kScoreMod, bool kDropout>
void launch_fwd_sm90(Flash_fwd_params &params, cudaStream_t stream, int num_sms, int l2_bytes) {
    auto kp = flash::sm90::make_fwd_kernel_params<Traits>(
        params, sm90_fwd_l2_group_bytes(params.seqlen_q, l2_bytes));
    auto kernel = &flash::sm90::flash_fwd_sm90_kernel<Traits, kIsCausal, kScoreMod, kDropout>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes) !=
        cudaSuccess) {
        return;
    }
    if constexpr (Traits::kDynamicTiles) {
        if (cudaMemsetAsync(params.fwd_workspace, 0, sizeof(flash::sm90::TileCounter), stream) != cudaSuccess) {
            return;
        }
    }
    if (params.cu_seqlens_q != nullptr && !Traits::kSplitBlocks) {  // fwd_split_blocks.h zeroes V's tails
        kp.sequence_maps = flash::sm90::build_fwd_sequence_maps(kp, stream);
        if (cudaPeekAtLastError() != cudaSuccess) {
            return;  // without the descriptors the kernel would load through uninitialized memory
        }
    }
    const int grid = int(std::min<int64_t>(kp.scheduler.num_tiles, num_sms));
    flash::launch_dependent(kernel, dim3(grid), dim3(Traits::kNumThreads), Traits::kSmemBytes, stream, kp);
}

// Errors (no sm_90a image for this GPU, too much shared memory) are left in cudaGetLastError()
// for the caller to report. params.fwd_workspace: fwd_workspace_size bytes (workspace.h).
template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_sm90(Flash_fwd_params &params, cudaStream_t stream) {
    const bool varlen = params.cu_seqlens_q != nullptr;
    // No query row: nothing to write (and no TMA descriptor can describe an empty tensor).
    if ((varlen ? params.total_q : params.seqlen_q) <= 0 || params.seqlen_q <= 0 || params.batch <= 0 ||
        params.num_heads <= 0) {
        return;
    }
    int device = 0, num_sms = 0, l2_bytes = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
        return;
    }
    using ShortTraits = Sm90FwdTraitsFor<Element, kHeadDim, kIsCausal, true>;
    using TallTraits = Sm90FwdTraitsFor<Element, kHeadDim, kIsCausal, false>;
    if constexpr (sm90_fwd_supports_dropout(kHeadDim)) {
        if (has_dropout(params)) {
            launch_fwd_sm90<ShortTraits, kIsCausal, true, true>(params, stream, num_sms, l2_bytes);
            return;
        }
    }
    if constexpr (sm90_fwd_supports_split_blocks(kHeadDim)) {
        if (!has_score_mod(params) && sm90_fwd_split_blocks_pay(params.seqlen_q, params.seqlen_k)) {
            launch_fwd_sm90<Sm90FwdSplitTraitsFor<Element, kHeadDim, kIsCausal>, kIsCausal, false, false>(
                params, stream, num_sms, l2_bytes);
            return;
        }
    }
    const bool tall = sm90_fwd_tall_tiles_pay(kHeadDim, kIsCausal, params.seqlen_q,
                                              int64_t(params.batch) * params.num_heads, num_sms);
    using Launch = void (*)(Flash_fwd_params &, cudaStream_t, int, int);
    const Launch launch[2][2] = {  // [score mod][tall tiles]
        {launch_fwd_sm90<ShortTraits, kIsCausal, false, false>, launch_fwd_sm90<TallTraits, kIsCausal, false, false>},
        {launch_fwd_sm90<ShortTraits, kIsCausal, true, false>, launch_fwd_sm90<TallTraits, kIsCausal, true, false>}};
    launch[has_score_mod(params)][tall](params, stream, num_sms, l2_bytes);
}
