// Compile-time dispatch of a family's entry points to its instantiated kernels, over what the
// build holds (setup.py defines FLASH_ATTN_DTYPE_FP16 / _BF16 and each family's head-dim list).
// Host code: no torch, no CuTe.
#pragma once

#include <cutlass/numeric_types.h>

namespace flash {

// Calls launch.template operator()<kHeadDim>() for the head dim among kHeadDims; false if none.
template <int... kHeadDims, class Launch>
bool dispatch_head_dim(int head_dim, Launch &&launch) {
    return ((head_dim == kHeadDims && (launch.template operator()<kHeadDims>(), true)) || ...);
}

// Calls launch.template operator()<Element>() for the built element type; false if not built.
template <class Launch>
bool dispatch_element(bool is_bf16, Launch &&launch) {
#ifdef FLASH_ATTN_DTYPE_BF16
    if (is_bf16) {
        return launch.template operator()<cutlass::bfloat16_t>();
    }
#endif
#ifdef FLASH_ATTN_DTYPE_FP16
    if (!is_bf16) {
        return launch.template operator()<cutlass::half_t>();
    }
#endif
    return false;
}

}  // namespace flash
