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
    return {args[0].toSymInt(), args[1].toSymInt(), args[2].toDouble(), args[3].toBool(),
            args[4].toInt(),    args[5].toInt(),    args[6].toBool()};
}

void AttentionOptions::push(torch::jit::Stack &stack) const {
    torch::jit::push(stack, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, deterministic);
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

void AttentionOptions::set_params(Flash_fwd_params &params) const {
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0, "softmax_scale must be positive, got ",
                      softmax_scale);
    TORCH_CHECK_VALUE(window_left >= -1 && window_right >= -1, "window_size must be (left, right) with each -1 "
                      "(unbounded) or >= 0, got (", window_left, ", ", window_right, ")");
    auto bound = [](int64_t side) { return side < 0 ? kWindowUnbounded : int(std::min<int64_t>(side, kWindowUnbounded)); };
    params.is_causal = causal;
    params.window_left = bound(window_left);
    params.window_right = causal ? 0 : bound(window_right);
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
}
