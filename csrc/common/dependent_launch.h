// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent may start while
// the kernel before it in the stream still runs, from the moment each of that kernel's blocks has
// called allow_next_grid (or exited); it must call wait_for_previous_grid before it reads what
// that kernel wrote (the wait returns once that kernel has finished and its writes are visible).
// Before sm_90, and after a kernel that never calls allow_next_grid (every torch kernel), the
// launch is an ordinary one. Under CUDA graph capture the dependence becomes a programmatic edge.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace flash {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), dependent on the kernel before it where the
// device has programmatic dependent launch (compute capability 9.0 and later).
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args &&...args) {
    int device = 0, major = 0;
    cudaError_t error = cudaGetDevice(&device);
    if (error == cudaSuccess) {
        error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    }
    if (error != cudaSuccess) {
        return error;
    }
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = major >= 9 ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flash
