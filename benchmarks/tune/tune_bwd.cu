// Times one backward tile shape (preprocess + main kernel + postprocess), chosen at compile time
// (TUNE_HDIM, TUNE_BLOCK_M, TUNE_BLOCK_N, TUNE_WARPS, TUNE_ATOM_SDP, TUNE_ATOM_DKV, TUNE_ATOM_DQ,
// TUNE_STAGES, and TUNE_DQ_BEFORE_DK, 0 unless given), over part of the paper's grid (the
// environment variable TUNE_SEQLENS, e.g. "1024,4096", picks the sequence lengths): the data
// behind csrc/sm80/bwd_tile_config.h. O and L come from the forward kernel of the dispatch table. Built
// and run by tune.sh.
#include "sm80/flash_bwd_launch_template.h"
#include "sm80/flash_fwd_launch_template.h"
#include "tune_common.h"

#ifndef TUNE_DQ_BEFORE_DK
#define TUNE_DQ_BEFORE_DK 0
#endif

using Traits = BwdKernelTraits<TUNE_HDIM, TUNE_BLOCK_M, TUNE_BLOCK_N, TUNE_WARPS, TUNE_ATOM_SDP, TUNE_ATOM_DKV,
                               TUNE_ATOM_DQ, TUNE_STAGES, TUNE_DQ_BEFORE_DK, Element>;

template <bool kIsCausal>
void time_config(int seqlen, uint32_t seed) {
    Buffers buffers;
    Flash_bwd_params p{};
    fill_grid_params(p, buffers, seqlen, TUNE_HDIM, kIsCausal, seed);
    flash::sm80::run_mha_fwd_<Element, TUNE_HDIM, kIsCausal>(p, 0);
    const int64_t numel = int64_t(p.batch) * seqlen * p.num_heads * TUNE_HDIM;
    p.do_ptr = buffers.random(numel, seed + 3);
    p.do_batch_stride = p.q_batch_stride;
    p.do_row_stride = p.q_row_stride;
    p.do_head_stride = p.q_head_stride;
    p.dq_ptr = buffers.alloc<Element>(numel);
    p.dk_ptr = buffers.alloc<Element>(numel);
    p.dv_ptr = buffers.alloc<Element>(numel);
    p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = p.q_batch_stride;
    p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = p.q_row_stride;
    p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = p.q_head_stride;
    p.accum_rows = (seqlen + TUNE_BLOCK_M - 1) / TUNE_BLOCK_M * TUNE_BLOCK_M;
    p.dq_accum_ptr = buffers.alloc<float>(int64_t(p.batch) * p.num_heads * p.accum_rows * TUNE_HDIM);
    p.softmax_d_ptr = buffers.alloc<float>(int64_t(p.batch) * p.num_heads * p.accum_rows);
    p.dq_semaphore_ptr = nullptr;
    const float ms = time_ms([&] { flash::sm80::launch_bwd<Traits, kIsCausal>(p, 0); });
    std::printf("bwd causal=%d seqlen=%d smem=%d ms=%.4f tflops=%.1f\n", int(kIsCausal), seqlen, Traits::kSmemSize, ms,
                2.5 * forward_flops(seqlen, TUNE_HDIM, kIsCausal) / ms * 1e-9);
}

int main() {
    for (int seqlen : seqlens_from_env({1024, 4096, 16384})) {
        time_config<false>(seqlen, 17u * seqlen);
        time_config<true>(seqlen, 31u * seqlen);
    }
    return 0;
}
