// MUFU throughput on this GPU: ex2.approx, tanh.approx and the two interleaved, in operations per
// clock per SM at the GPU's maximum clock (benchmarks/NOTES.md, run 152: both 16 on the H100, one
// shared unit, so softcap's tanh costs the softmax as much MUFU time as its exponential).
//   nvcc -arch=sm_90a -O3 -o /tmp/mufu benchmarks/sm90/mufu_throughput.cu && /tmp/mufu
#include <cstdio>

#include <cuda_runtime.h>

enum class Op { kEx2, kTanh, kBoth };

// Eight independent chains per thread, so that latency is hidden and the unit's throughput shows.
template <Op kOp>
__global__ void chains(float *out, int iters) {
    float x[8];
    for (int i = 0; i < 8; ++i) {
        x[i] = 0.001f * float(threadIdx.x + i);
    }
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (kOp == Op::kTanh || (kOp == Op::kBoth && (i & 1))) {
                asm volatile("tanh.approx.f32 %0, %0;" : "+f"(x[i]));
            } else {
                asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(x[i]));
            }
        }
    }
    float sum = 0.f;
    for (int i = 0; i < 8; ++i) {
        sum += x[i];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <Op kOp>
void measure(const char *name, float *out, int sms, int clock_khz) {
    constexpr int kIters = 4096, kThreads = 512;
    const int blocks = sms * 4;
    chains<kOp><<<blocks, kThreads>>>(out, 16);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start);
    chains<kOp><<<blocks, kThreads>>>(out, kIters);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    const double ops = double(blocks) * kThreads * kIters * 8;
    printf("%-9s %.3f ms  %.1f ops per clock per SM\n", name, ms, ops / (ms * 1e-3) / sms / (clock_khz * 1e3));
}

int main() {
    int sms = 0, clock_khz = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    float *out = nullptr;
    cudaMalloc(&out, sizeof(float) * sms * 4 * 512);
    for (int repeat = 0; repeat < 2; ++repeat) {
        measure<Op::kEx2>("ex2", out, sms, clock_khz);
        measure<Op::kTanh>("tanh", out, sms, clock_khz);
        measure<Op::kBoth>("ex2+tanh", out, sms, clock_khz);
    }
    cudaFree(out);
    return 0;
}
