// The fp32 dQ accumulator of one Q block (kBlockM x kHeadDim floats) is kept in the main backward
// kernel's register order, not in (row, col) order: register i of thread t lives at
// (i / 4) * 4 * kNThreads + 4 * t + i % 4. A warp's atomic add of 4 registers then covers 512
// contiguous bytes instead of 8 rows of 32 bytes; the postprocess kernel maps the floats back to
// (row, col) with the same TiledMma partition.
#pragma once

namespace flash {

template <int kNThreads>
__device__ inline int dq_accum_index(int i, int tidx) {
    return (i / 4) * 4 * kNThreads + 4 * tidx + i % 4;
}

// dst[0..3] += v (dst 16-byte aligned), in one reduction where the GPU has it. sm90's
// atomicAdd(float4 *) compiles to an atomic that returns the old values (ATOM, not RED) even when
// they are unused: 16 bytes back from L2 per add and a register dependency (NOTES.md, run 15).
__device__ inline void atomic_add4(float *dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    atomicAdd(dst, v.x);
    atomicAdd(dst + 1, v.y);
    atomicAdd(dst + 2, v.z);
    atomicAdd(dst + 3, v.w);
#endif
}

}  // namespace flash
