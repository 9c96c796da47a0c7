#include "api/options.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <c10/util/Exception.h>

#include "common/dropout_threshold.h"

namespace {

std::string saved_key(int index) { return "option" + std::to_string(index); }

}  // namespace

AttentionOptions AttentionOptions::from_stack(c10::ArrayRef<c10::IValue> args) {
    TORCH_INTERNAL_ASSERT(args.size() == kCount);
    return {args[0].toSymInt(), args[1].toSymInt(), args[2].toDouble(),
            args[3].toBool(),   args[4].toInt(),    args[5].toInt(),
            args[6].toDouble(), args[7].toOptional<at::Tensor>(), args[8].toBool(),
            args[9].toDouble(), args[10].toBool()};
}

void AttentionOptions::push(torch::jit::Stack &stack) const {
    torch::jit::push(stack, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                     alibi_slopes, deterministic, dropout_p, return_softmax);
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
    TORCH_CHECK_VALUE(std::isfinite(softmax_scale) && softmax_scale > 0 && std::isnormal(static_cast<float>(softmax_scale)),
                      "softmax_scale must be positive and finite (a normal float32 number), got ", softmax_scale);
    TORCH_CHECK_VALUE(window_left >= -1 && window_right >= -1, "window_size must be (left, right) with each -1 "
                      "(unbounded) or >= 0, got (", window_left, ", ", window_right, ")");
    // flash-attn 2.x's normalization of a given window (its C++ entry points): a side at least
    // seqlen_k wide is unbounded, and with one side bounded an unbounded other side becomes seqlen_k
    // (max_seqlen_k for varlen). It differs from "-1 is unbounded" only where seqlen_q > seqlen_k.
    int64_t left = window_left, right = causal ? 0 : window_right;
    if (window_left >= 0 || window_right >= 0) {
        const int64_t seqlen_k = params.seqlen_k;
        left = left >= seqlen_k ? -1 : left;
        right = right >= seqlen_k ? -1 : right;
        if (left < 0 && right >= 0) {
            left = seqlen_k;
        } else if (left >= 0 && right < 0) {
            right = seqlen_k;
        }
    }
    auto bound = [](int64_t side) { return side < 0 ? kWindowUnbounded : int(std::min<int64_t>(side, kWindowUnbounded)); };
    params.is_causal = causal;
    params.window_left = bound(left);
    params.window_right = bound(right);
    // Checked as the kernels see them, in float: a softcap whose float or softmax_scale / softcap
    // is not a normal number would silently disable or corrupt the cap.
    const float softcap_f = static_cast<float>(softcap);
    TORCH_CHECK_VALUE(softcap == 0 || (softcap > 0 && std::isnormal(softcap_f) &&
                                       std::isnormal(static_cast<float>(softmax_scale / softcap))),
                      "softcap must be 0 (off) or a positive float32 number that softmax_scale / softcap also fits, got ",
                      softcap);
    params.softcap = softcap_f;
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
        // As flash-attn: any batch stride (a view expanded over the batch has 0), the heads contiguous.
        TORCH_CHECK_VALUE(slopes.stride(-1) == 1 || params.num_heads == 1,
                          "alibi_slopes must have a contiguous last dimension, got strides ", slopes.strides());
        TORCH_CHECK_VALUE(!per_batch || slopes.stride(0) <= std::numeric_limits<int>::max(),
                          "alibi_slopes' batch stride must fit in 32 bits, got ", slopes.stride(0));
        params.alibi_slopes_ptr = slopes.data_ptr<float>();
        params.alibi_slopes_batch_stride = per_batch ? static_cast<int>(slopes.stride(0)) : 0;
    }
    params.softmax_scale = static_cast<float>(softmax_scale);
    params.softmax_scale_log2 = static_cast<float>(softmax_scale * M_LOG2E);
    TORCH_CHECK_VALUE(dropout_p >= 0 && dropout_p < 1, "dropout_p must be in [0, 1), got ", dropout_p);
    params.p_dropout = static_cast<float>(dropout_p);
    // round((1 - p) 2^16) of the 2^16 16-bit numbers are kept: at least one, so that 1 / (1 - p) stays finite.
    const auto keep = flash::dropout_threshold(
        static_cast<uint32_t>(std::clamp<int64_t>(std::llround((1.0 - dropout_p) * 65536.0), 1, 65536)));
    params.dropout_keep_threshold = keep.threshold * 0x10001u;
    params.dropout_keep_invert = keep.invert ? 0xFFFFFFFFu : 0u;
    params.dropout_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
    params.return_softmax = return_softmax && dropout_p > 0;
}
