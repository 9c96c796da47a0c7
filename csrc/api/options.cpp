#include "api/options.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <c10/util/Exception.h>

namespace {

std::string saved_key(int index) { return "option" + std::to_string(index); }

}  // namespace

AttentionOptions AttentionOptions::from_stack(c10::ArrayRef<c10::IValue> args) {
    TORCH_INTERNAL_ASSERT(args.size() == kCount);
    return {args[0].toSymInt(), args[1].toSymInt(), args[2].toDouble(),
            args[3].toBool(),   args[4].toInt(),    args[5].toInt(),
            args[6].toDouble(), args[7].toOptional<at::Tensor>(), args[8].toBool()};
}

void AttentionOptions::push(torch::jit::Stack &stack) const {
    torch::jit::push(stack, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                     alibi_slopes, deterministic);
}

void AttentionOptions::save(torch::autograd::AutogradContext *ctx) const {
    torch::jit::Stack values;
    push(values);
    for (int i = 0; i < kCount; ++i) {
        ctx->saved_data[saved_key(i)] = values[i];
    }
}

AttentionOptions AttentionOptions::saved(torch::autograd::AutogradContext *ctx) {
    torch::jit::Stack values;
    for (int i = 0; i < kCount; ++i) {
        values.push_back(ctx->saved_data[saved_key(i)]);
    }
    return from_stack(values);
}

void AttentionOptions::set_params(Flash_fwd_params &params, const at::Tensor &q) const {
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0, "softmax_scale must be positive, got ",
                      softmax_scale);
    TORCH_CHECK_VALUE(window_left >= -1 && window_right >= -1, "window_size must be (left, right) with each -1 "
                      "(unbounded) or >= 0, got (", window_left, ", ", window_right, ")");
    auto bound = [](int64_t side) { return side < 0 ? kWindowUnbounded : int(std::min<int64_t>(side, kWindowUnbounded)); };
    params.is_causal = causal;
    params.window_left = bound(window_left);
    params.window_right = causal ? 0 : bound(window_right);
    TORCH_CHECK_VALUE(std::isfinite(softcap) && softcap >= 0, "softcap must be >= 0 (0 is off), got ", softcap);
    params.softcap = static_cast<float>(softcap);
    params.alibi_slopes_ptr = nullptr;
    if (alibi_slopes.has_value()) {
        const at::Tensor &slopes = *alibi_slopes;
        TORCH_CHECK_TYPE(slopes.scalar_type() == at::kFloat, "alibi_slopes must be float32, got ", slopes.scalar_type());
        TORCH_CHECK_VALUE(slopes.device() == q.device(), "alibi_slopes must be on the device of q (", q.device(),
                          "), got ", slopes.device());
        const bool per_head = slopes.dim() == 1 && slopes.size(0) == params.num_heads;
        const bool per_batch = slopes.dim() == 2 && slopes.size(0) == params.batch && slopes.size(1) == params.num_heads;
        TORCH_CHECK_VALUE(per_head || per_batch, "alibi_slopes must have shape (nheads,) = (", params.num_heads,
                          ",) or (batch, nheads) = (", params.batch, ", ", params.num_heads, "), got ", slopes.sizes());
        TORCH_CHECK_VALUE(slopes.is_contiguous(), "alibi_slopes must be contiguous");
        params.alibi_slopes_ptr = slopes.data_ptr<float>();
        params.alibi_slopes_batch_stride = per_batch ? params.num_heads : 0;
    }
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
}
