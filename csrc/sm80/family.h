// The FA2 family (mma.sync, cp.async; sm80, sm86, sm89 and sm90), as the API sees it: host entry
// points that pick the compiled kernel for (element, head dim, causal), and the backward's needs.
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"

namespace flash::sm80 {

// Launch the forward / backward on stream; false if this build has no kernel for the params'
// element type and head dim.
bool run_fwd(Flash_fwd_params &params, cudaStream_t stream);
bool run_bwd(Flash_bwd_params &params, cudaStream_t stream);

// The scratch buffers the backward of params needs (params' shapes, lengths and varlen-ness).
BwdWorkspace bwd_workspace(const Flash_bwd_params &params, bool deterministic);

// Shared memory per thread block the backward needs at this kernel head dim (its base table entry;
// the launcher takes a larger one where the table has one and the GPU the room).
int bwd_smem_bytes(int head_dim);

}  // namespace flash::sm80
