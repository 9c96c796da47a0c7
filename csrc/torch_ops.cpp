// The ops torch.ops.flash_attn_cuda.{fwd, bwd, packed_fwd, packed_bwd}: their schemas, their CUDA
// kernels (on flash_api.cpp's entry points) and their autograd. The fake implementations with which
// torch.compile traces them are in flash_attn_cuda/fake_ops.py.
//
// The autograd is a C++ Function, not a Python one: autograd then runs the backward on its CUDA
// device thread without taking the GIL or entering Python, which cost ~0.2 ms of host time per
// backward on the H100 machine (benchmarks/NOTES.md, run 36).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "flash_api.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<Tensor>;

// The max_seqlen arguments are SymInt in the schemas, so that torch.compile keeps them symbolic (a
// varlen batch's longest sequence changes from step to step); the CUDA kernels see their values.
std::tuple<Tensor, Tensor> fwd(const Tensor &q, const Tensor &k, const Tensor &v, const OptionalTensor &cu_seqlens_q,
                               const OptionalTensor &cu_seqlens_k, c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
                               double softmax_scale, bool causal, bool /* deterministic: for the backward */) {
    return mha_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q.expect_int(), max_seqlen_k.expect_int(),
                   softmax_scale, causal);
}

std::tuple<Tensor, Tensor, Tensor> bwd(const Tensor &dout, const Tensor &q, const Tensor &k, const Tensor &v,
                                       const Tensor &out, const Tensor &softmax_lse, const OptionalTensor &cu_seqlens_q,
                                       const OptionalTensor &cu_seqlens_k, c10::SymInt max_seqlen_q,
                                       c10::SymInt max_seqlen_k, double softmax_scale, bool causal,
                                       bool deterministic) {
    return mha_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q.expect_int(),
                   max_seqlen_k.expect_int(), softmax_scale, causal, deterministic, std::nullopt, std::nullopt,
                   std::nullopt);
}

// (q, k, v) from a packed qkv (..., 3, nheads, head_dim) (q none) or from q and a packed kv
// (..., 2, nheads_k, head_dim).
std::tuple<Tensor, Tensor, Tensor> unpack(const OptionalTensor &q, const Tensor &packed) {
    const int64_t parts = q.has_value() ? 2 : 3;
    TORCH_CHECK_VALUE(packed.dim() >= 3 && packed.size(-3) == parts, "the packed tensor must have ", parts,
                      " parts in its third dimension from the last, got shape ", packed.sizes());
    if (q.has_value()) {
        return {*q, packed.select(-3, 0), packed.select(-3, 1)};
    }
    return {packed.select(-3, 0), packed.select(-3, 1), packed.select(-3, 2)};
}

std::tuple<Tensor, Tensor> packed_fwd(const OptionalTensor &q, const Tensor &packed, const OptionalTensor &cu_seqlens_q,
                                      const OptionalTensor &cu_seqlens_k, c10::SymInt max_seqlen_q,
                                      c10::SymInt max_seqlen_k, double softmax_scale, bool causal,
                                      bool /* deterministic: for the backward */) {
    const auto [q_, k, v] = unpack(q, packed);
    return mha_fwd(q_, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q.expect_int(), max_seqlen_k.expect_int(),
                   softmax_scale, causal);
}

// Returns (dq, dpacked); dq is empty when q is none (its gradient is in dpacked). The kernel writes
// into views of dpacked, so that the gradient of the packed tensor is one tensor, not three that
// autograd would stack (a copy).
std::tuple<Tensor, Tensor> packed_bwd(const Tensor &dout, const OptionalTensor &q, const Tensor &packed,
                                      const Tensor &out, const Tensor &softmax_lse, const OptionalTensor &cu_seqlens_q,
                                      const OptionalTensor &cu_seqlens_k, c10::SymInt max_seqlen_q,
                                      c10::SymInt max_seqlen_k, double softmax_scale, bool causal, bool deterministic) {
    const Tensor dpacked = at::empty(packed.sizes(), packed.options());
    const Tensor dq = q.has_value() ? at::empty(q->sizes(), q->options()) : at::empty({0}, packed.options());
    const auto [q_, k, v] = unpack(q, packed);
    const auto [dq_, dk, dv] = unpack(q.has_value() ? OptionalTensor(dq) : std::nullopt, dpacked);
    mha_bwd(dout, q_, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q.expect_int(),
            max_seqlen_k.expect_int(), softmax_scale, causal, deterministic, dq_, dk, dv);
    return {dq, dpacked};
}

// The op through the dispatcher: below autograd in a Function's forward, and visible to
// torch.compile's tracing in both directions.
template <typename Kernel>
c10::TypedOperatorHandle<Kernel> op_handle(const char *name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Kernel>();
}

// The arguments of a forward op after its tensors, which its backward op takes too.
struct Options {
    c10::SymInt max_seqlen_q, max_seqlen_k;
    double softmax_scale;
    bool causal, deterministic;
};

// softmax_lse carries no gradient: the Autograd kernels return it detached, and no gradient is
// materialized for it (a zero-fill per backward). Marking it non-differentiable instead would
// break compiled autograd, which asserts that no output is so marked.
void keep_options(AutogradContext *ctx, const Options &options) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["max_seqlen_q"] = options.max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = options.max_seqlen_k;
    ctx->saved_data["softmax_scale"] = options.softmax_scale;
    ctx->saved_data["causal"] = options.causal;
    ctx->saved_data["deterministic"] = options.deterministic;
}

Options kept_options(AutogradContext *ctx) {
    return {ctx->saved_data["max_seqlen_q"].toSymInt(), ctx->saved_data["max_seqlen_k"].toSymInt(),
            ctx->saved_data["softmax_scale"].toDouble(), ctx->saved_data["causal"].toBool(),
            ctx->saved_data["deterministic"].toBool()};
}

// save_for_backward takes tensors; an absent one is saved undefined.
Tensor or_undefined(const OptionalTensor &t) { return t.value_or(Tensor()); }
OptionalTensor or_none(const Tensor &t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// The backward of a Function of kInputs inputs: run_op(dout, saved tensors, options, input_grads)
// fills the gradients, unless out got none (only softmax_lse was used), when no input gets one.
template <int kInputs, class RunOp>
variable_list attention_backward(AutogradContext *ctx, const variable_list &grads, RunOp &&run_op) {
    variable_list input_grads(kInputs);
    if (grads[0].defined()) {
        run_op(grads[0], ctx->get_saved_variables(), kept_options(ctx), input_grads);
    }
    return input_grads;
}

// Saves q, k, v, out, softmax_lse (and cu_seqlens): no seqlen^2 buffer.
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
    static constexpr int kInputs = 10;

    static variable_list forward(AutogradContext *ctx, const Tensor &q, const Tensor &k, const Tensor &v,
                                 const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                 c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k, double softmax_scale, bool causal,
                                 bool deterministic) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        static const auto fwd_op = op_handle<decltype(fwd)>("flash_attn_cuda::fwd");
        const auto [out, softmax_lse] = fwd_op.call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                    softmax_scale, causal, deterministic);
        ctx->save_for_backward({q, k, v, out, softmax_lse, or_undefined(cu_seqlens_q), or_undefined(cu_seqlens_k)});
        keep_options(ctx, {max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic});
        return {out, softmax_lse};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        return attention_backward<kInputs>(ctx, grads, [](const Tensor &dout, const variable_list &saved,
                                                          const Options &o, variable_list &input_grads) {
            static const auto bwd_op = op_handle<decltype(bwd)>("flash_attn_cuda::bwd");
            std::tie(input_grads[0], input_grads[1], input_grads[2]) =
                bwd_op.call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], or_none(saved[5]),
                            or_none(saved[6]), o.max_seqlen_q, o.max_seqlen_k, o.softmax_scale, o.causal,
                            o.deterministic);
        });
    }
};

// Saves q (if given), the packed tensor, out and softmax_lse (and cu_seqlens).
struct PackedAttentionFunction : torch::autograd::Function<PackedAttentionFunction> {
    static constexpr int kInputs = 9;

    static variable_list forward(AutogradContext *ctx, const OptionalTensor &q, const Tensor &packed,
                                 const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                 c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k, double softmax_scale, bool causal,
                                 bool deterministic) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        static const auto fwd_op = op_handle<decltype(packed_fwd)>("flash_attn_cuda::packed_fwd");
        const auto [out, softmax_lse] = fwd_op.call(q, packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                    max_seqlen_k, softmax_scale, causal, deterministic);
        ctx->save_for_backward(
            {or_undefined(q), packed, out, softmax_lse, or_undefined(cu_seqlens_q), or_undefined(cu_seqlens_k)});
        keep_options(ctx, {max_seqlen_q, max_seqlen_k, softmax_scale, causal, deterministic});
        return {out, softmax_lse};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        return attention_backward<kInputs>(ctx, grads, [](const Tensor &dout, const variable_list &saved,
                                                          const Options &o, variable_list &input_grads) {
            static const auto bwd_op = op_handle<decltype(packed_bwd)>("flash_attn_cuda::packed_bwd");
            auto [dq, dpacked] =
                bwd_op.call(dout, or_none(saved[0]), saved[1], saved[2], saved[3], or_none(saved[4]),
                            or_none(saved[5]), o.max_seqlen_q, o.max_seqlen_k, o.softmax_scale, o.causal,
                            o.deterministic);
            if (saved[0].defined()) {
                input_grads[0] = dq;
            }
            input_grads[1] = dpacked;
        });
    }
};

std::tuple<Tensor, Tensor> fwd_autograd(const Tensor &q, const Tensor &k, const Tensor &v,
                                        const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                        c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k, double softmax_scale,
                                        bool causal, bool deterministic) {
    const variable_list outputs = AttentionFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                           max_seqlen_k, softmax_scale, causal, deterministic);
    return {outputs[0], outputs[1].detach()};
}

std::tuple<Tensor, Tensor> packed_fwd_autograd(const OptionalTensor &q, const Tensor &packed,
                                               const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                               c10::SymInt max_seqlen_q, c10::SymInt max_seqlen_k,
                                               double softmax_scale, bool causal, bool deterministic) {
    const variable_list outputs = PackedAttentionFunction::apply(q, packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                                 max_seqlen_k, softmax_scale, causal, deterministic);
    return {outputs[0], outputs[1].detach()};
}

}  // namespace

TORCH_LIBRARY(flash_attn_cuda, m) {
    // Where torch looks for the fake implementations when an op is traced before _extension.load().
    m.set_python_module("flash_attn_cuda.fake_ops");
    m.def(
        "fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, "
        "SymInt max_seqlen_k, float softmax_scale, bool causal, bool deterministic) "
        "-> (Tensor out, Tensor softmax_lse)");
    m.def(
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? cu_seqlens_q, "
        "Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, bool causal, "
        "bool deterministic) -> (Tensor dq, Tensor dk, Tensor dv)");
    m.def(
        "packed_fwd(Tensor? q, Tensor packed, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, "
        "SymInt max_seqlen_k, float softmax_scale, bool causal, bool deterministic) "
        "-> (Tensor out, Tensor softmax_lse)");
    m.def(
        "packed_bwd(Tensor dout, Tensor? q, Tensor packed, Tensor out, Tensor softmax_lse, Tensor? cu_seqlens_q, "
        "Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, bool causal, "
        "bool deterministic) -> (Tensor dq, Tensor dpacked)");
}

TORCH_LIBRARY_IMPL(flash_attn_cuda, CUDA, m) {
    m.impl("fwd", &fwd);
    m.impl("bwd", &bwd);
    m.impl("packed_fwd", &packed_fwd);
    m.impl("packed_bwd", &packed_bwd);
}

// The backward ops have no derivative: a double backward through them raises instead of
// silently giving no gradient.
TORCH_LIBRARY_IMPL(flash_attn_cuda, Autograd, m) {
    m.impl("fwd", &fwd_autograd);
    m.impl("packed_fwd", &packed_fwd_autograd);
    m.impl("bwd", torch::autograd::autogradNotImplementedFallback());
    m.impl("packed_bwd", torch::autograd::autogradNotImplementedFallback());
}
