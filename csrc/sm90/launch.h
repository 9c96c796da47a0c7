// The Hopper family's forward launcher, instantiated per (element, head dim, causal) in
// csrc/instantiations/sm90/ (generate_kernels.py); defined in sm90/fwd_launch.h. Errors are left in
// cudaGetLastError().
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_sm90(Flash_fwd_params &params, cudaStream_t stream);

// The backward launcher, instantiated the same way; defined in sm90/bwd_launch.h.
template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_bwd_sm90(Flash_bwd_params &params, cudaStream_t stream);
