// Float adds into global memory that return nothing (RED, not ATOM), for the dQ accumulators.
// sm_90's atomicAdd on float2 and float4 compiles to an atomic that returns the old values (ATOM)
// even when they are unused, or did once the kernel held unrelated fences: bytes back from L2 per
// add and a slower atomic path (the FA2 family's float4, NOTES.md run 15; the Hopper backward's
// float2 at d = 256 after 7ec479f, 14-17% slower, run 323). Written out here.
#pragma once

namespace flash {

// dst[0..1] += (x, y), dst 8-byte aligned.
__device__ __forceinline__ void red_add2(float *dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(dst), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}

// dst[0..3] += v, dst 16-byte aligned.
__device__ __forceinline__ void red_add4(float *dst, float4 v) {
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
