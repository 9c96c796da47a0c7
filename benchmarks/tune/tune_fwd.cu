// Times one forward tile shape, chosen at compile time (TUNE_HDIM, TUNE_BLOCK_M, TUNE_BLOCK_N,
// TUNE_WARPS), over part of the paper's grid (the environment variable TUNE_SEQLENS, e.g.
// "512,1024", picks the sequence lengths): the data behind csrc/sm80/fwd_tile_config.h. Built and run by
// tune.sh, one binary per shape.
#include "sm80/flash_fwd_launch_template.h"
#include "tune_common.h"

using Traits = FwdKernelTraits<TUNE_HDIM, TUNE_BLOCK_M, TUNE_BLOCK_N, TUNE_WARPS, Element>;

template <bool kIsCausal>
void time_config(int seqlen, uint32_t seed) {
    Buffers buffers;
    Flash_fwd_params p{};
    fill_grid_params(p, buffers, seqlen, TUNE_HDIM, kIsCausal, seed);
    const float ms = time_ms([&] { flash::sm80::launch_fwd<Traits, kIsCausal, false>(p, 0); });
    std::printf("fwd causal=%d seqlen=%d smem=%d ms=%.4f tflops=%.1f\n", int(kIsCausal), seqlen, Traits::kSmemSize, ms,
                forward_flops(seqlen, TUNE_HDIM, kIsCausal) / ms * 1e-9);
}

int main() {
    for (int seqlen : seqlens_from_env({512, 2048, 8192})) {
        time_config<false>(seqlen, 17u * seqlen);
        time_config<true>(seqlen, 31u * seqlen);
    }
    return 0;
}
