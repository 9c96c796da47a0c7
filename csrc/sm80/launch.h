// The sm80 family's launchers, instantiated per (element, head dim, causal) in
// csrc/instantiations/sm80/ (generate_kernels.py). Errors are left in cudaGetLastError().
#pragma once

#include <cuda_runtime.h>

#include "common/flash.h"

namespace flash::sm80 {

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_(Flash_fwd_params &params, cudaStream_t stream);

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_bwd_(Flash_bwd_params &params, cudaStream_t stream);

}  // namespace flash::sm80
