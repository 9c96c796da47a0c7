// The fp32 dQ accumulator of one Q block (kBlockM x kHeadDim floats) is kept in the main backward
// kernel's register order, not in (row, col) order: register i of thread t lives at
// (i / 4) * 4 * kNThreads + 4 * t + i % 4. A warp's atomic add of 4 registers then covers 512
// contiguous bytes instead of 8 rows of 32 bytes; the postprocess kernel maps the floats back to
// (row, col) with the same TiledMma partition.
#pragma once

#include "common/global_reduce.h"

namespace flash {

template <int kNThreads>
__device__ inline int dq_accum_index(int i, int tidx) {
    return (i / 4) * 4 * kNThreads + 4 * tidx + i % 4;
}

}  // namespace flash
