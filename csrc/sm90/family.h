// The Hopper family (sm_90a: TMA, wgmma, warp specialization), as the API sees it: the forward,
// and the backward at d=64, 128 and 256; what this family does not support runs on the FA2 family.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/flash.h"

namespace flash::sm90 {

// Whether this build has a kernel for the params (element type, head dim, strides).
bool supports_fwd(const Flash_fwd_params &params);

// Bytes of scratch memory run_fwd needs at params.fwd_workspace (causal: the tile counter of the
// dynamic schedule, which it zeroes on its stream; varlen: TMA descriptors per sequence), 0 for none.
size_t fwd_workspace_bytes(const Flash_fwd_params &params);

// Launch the forward on stream; false if this build has no kernel for the params.
bool run_fwd(Flash_fwd_params &params, cudaStream_t stream);

// Whether this build's backward serves the params: padded or varlen problems at a head dim it is
// built for.
bool supports_bwd(const Flash_bwd_params &params);

// Whether the backward of params (deterministic or not) has enough query rows, and tiles shaped for
// the dQ turns, to run faster here than on the FA2 family (bwd_config.h).
bool bwd_pays(const Flash_bwd_params &params, bool deterministic);

// The scratch buffers the backward of params needs (deterministic: with the dQ turn counters).
BwdWorkspace bwd_workspace(const Flash_bwd_params &params, bool deterministic);

// Launch the backward on stream; false if this build has no kernel for the params.
bool run_bwd(Flash_bwd_params &params, cudaStream_t stream);

}  // namespace flash::sm90
