// The Hopper family (sm_90a: TMA, wgmma, warp specialization), as the API sees it: the forward
// only; the backward and what this family does not support run on the FA2 family.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/flash.h"

namespace flash::sm90 {

// Whether this build has a kernel for the params (element type, head dim, strides).
bool supports_fwd(const Flash_fwd_params &params);

// Bytes of scratch memory run_fwd needs at params.fwd_workspace (causal: the tile counter of the
// dynamic schedule; it zeroes them on its stream), 0 for none.
size_t fwd_workspace_bytes(const Flash_fwd_params &params);

// Launch the forward on stream; false if this build has no kernel for the params.
bool run_fwd(Flash_fwd_params &params, cudaStream_t stream);

}  // namespace flash::sm90
