#include "api/dropout.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <mutex>

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

FwdDropoutTensors set_fwd_dropout(Flash_fwd_params &params, const Problem &p, const AttentionOptions &options,
                                  const at::Tensor &q) {
    if (!has_dropout(params)) {
        return {at::empty({0}, q.options().dtype(at::kLong)), at::empty({0}, q.options())};
    }
    FwdDropoutTensors tensors;
    tensors.rng_state = at::empty({2}, q.options().dtype(at::kLong));
    params.rng_state_ptr = tensors.rng_state.data_ptr<int64_t>();
    // common/dropout.h: 4 x 128 counters of torch's offset per 64 keys.
    const uint64_t increment = 512 * ((uint64_t(p.seqlen_k) + 63) / 64);
    auto *gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
        std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(q.device().index()));
    at::PhiloxCudaState state;
    {
        std::lock_guard<std::mutex> lock(gen->mutex_);
        state = gen->philox_cuda_state(increment);
    }
    if (state.captured_) {
        params.philox = {0, 0, state.seed_.ptr, state.offset_.ptr, state.offset_intragraph_, true};
    } else {
        params.philox = {state.seed_.val, state.offset_.val, nullptr, nullptr, 0, false};
    }
    if (options.return_softmax) {
        const int64_t rows = round_up(p.seqlen_q, 128), cols = round_up(p.seqlen_k, 128);
        // The kernel addresses a tile of S_dmask with 32-bit offsets.
        TORCH_CHECK_VALUE(cols * 128 < (int64_t(1) << 31), "return_attn_probs with dropout supports seqlen_k up to ",
                          (int64_t(1) << 24) - 128, ", got ", p.seqlen_k);
        tensors.s_dmask = at::zeros({p.batch, p.num_heads, rows, cols}, q.options());
        params.s_dmask_ptr = tensors.s_dmask.data_ptr();
        params.s_dmask_row_stride = cols;
        params.s_dmask_head_stride = rows * cols;
        params.s_dmask_batch_stride = p.num_heads * rows * cols;
    } else {
        tensors.s_dmask = at::empty({0}, q.options());
    }
    return tensors;
}

void set_bwd_dropout(Flash_bwd_params &params, const std::optional<at::Tensor> &rng_state, const at::Tensor &q) {
    if (!has_dropout(params)) {
        return;
    }
    TORCH_CHECK_VALUE(rng_state.has_value() && rng_state->scalar_type() == at::kLong && rng_state->numel() == 2 &&
                          rng_state->is_contiguous() && rng_state->device() == q.device(),
                      "the backward with dropout needs the forward's rng_state: int64 (seed, offset) on the device "
                      "of q");
    int64_t *seed_offset = rng_state->data_ptr<int64_t>();
    params.philox = {0, 0, seed_offset, seed_offset + 1, 0, true};
}
