// The ops torch.ops.flash_attn_cuda.{fwd, bwd, packed_fwd, packed_bwd}: their schemas, their CUDA
// kernels (on attention.cpp's entry points) and their autograd. The fake implementations with which
// torch.compile traces them are in flash_attn_cuda/fake_ops.py.
//
// Every op's schema ends in the attention options (AttentionOptions::kSchema), and its kernels are
// boxed: they take the options off the stack as one struct, so that a new option is written in
// options.h/.cpp, not in each op's signature.
//
// The autograd is a C++ Function, not a Python one: autograd then runs the backward on its CUDA
// device thread without taking the GIL or entering Python, which cost ~0.2 ms of host time per
// backward on the H100 machine (benchmarks/NOTES.md, run 36).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>
#include <utility>

#include "api/attention.h"
#include "api/options.h"

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::jit::Stack;
using OptionalTensor = std::optional<Tensor>;

// The arguments of a boxed call that come before the options, and the options.
struct BoxedArgs {
    c10::ArrayRef<c10::IValue> tensors;
    AttentionOptions options;
};

BoxedArgs boxed_args(const Stack &stack, size_t num_tensors) {
    const auto args = torch::jit::last(stack, num_tensors + AttentionOptions::kCount);
    return {args.slice(0, num_tensors), AttentionOptions::from_stack(args.slice(num_tensors))};
}

// Replaces an op's arguments on the stack with its outputs.
template <class... Outputs>
void set_outputs(Stack &stack, size_t num_tensors, Outputs &&...outputs) {
    torch::jit::drop(stack, num_tensors + AttentionOptions::kCount);
    torch::jit::push(stack, std::forward<Outputs>(outputs)...);
}

// Calls the op through the dispatcher (below autograd in a Function, and visible to torch.compile's
// tracing in both directions); returns its outputs.
template <class... Tensors>
Stack call_op(const c10::OperatorHandle &op, const AttentionOptions &options, Tensors &&...tensors) {
    Stack stack;
    torch::jit::push(stack, std::forward<Tensors>(tensors)...);
    options.push(stack);
    op.callBoxed(stack);
    return stack;
}

c10::OperatorHandle op_handle(const char *name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
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

void push_fwd_outputs(Stack &stack, size_t num_tensors, FwdOutputs outputs) {
    set_outputs(stack, num_tensors, std::move(outputs.out), std::move(outputs.softmax_lse),
                std::move(outputs.rng_state), std::move(outputs.s_dmask));
}

// fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, options) -> (out, softmax_lse, rng_state, s_dmask)
void fwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 5);
    push_fwd_outputs(*stack, 5, mha_fwd(t[0].toTensor(), t[1].toTensor(), t[2].toTensor(), t[3].toOptional<Tensor>(),
                                        t[4].toOptional<Tensor>(), options));
}

// bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, rng_state, options) -> (dq, dk, dv)
void bwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 9);
    auto [dq, dk, dv] = mha_bwd(t[0].toTensor(), t[1].toTensor(), t[2].toTensor(), t[3].toTensor(), t[4].toTensor(),
                                t[5].toTensor(), t[6].toOptional<Tensor>(), t[7].toOptional<Tensor>(),
                                t[8].toOptional<Tensor>(), options, std::nullopt, std::nullopt, std::nullopt);
    set_outputs(*stack, 9, std::move(dq), std::move(dk), std::move(dv));
}

// packed_fwd(q or none, packed, cu_seqlens_q, cu_seqlens_k, options) -> (out, softmax_lse, rng_state, s_dmask)
void packed_fwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 4);
    const auto [q, k, v] = unpack(t[0].toOptional<Tensor>(), t[1].toTensor());
    push_fwd_outputs(*stack, 4, mha_fwd(q, k, v, t[2].toOptional<Tensor>(), t[3].toOptional<Tensor>(), options));
}

// packed_bwd(dout, q or none, packed, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, rng_state, options)
// -> (dq, dpacked); dq is empty when q is none (its gradient is in dpacked). The kernel writes into
// views of dpacked, so that the gradient of the packed tensor is one tensor, not three that autograd
// would stack (a copy).
void packed_bwd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 8);
    const OptionalTensor q_given = t[1].toOptional<Tensor>();
    const Tensor packed = t[2].toTensor();
    Tensor dpacked = at::empty(packed.sizes(), packed.options());
    Tensor dq = q_given.has_value() ? at::empty(q_given->sizes(), q_given->options()) : at::empty({0}, packed.options());
    const auto [q, k, v] = unpack(q_given, packed);
    const auto [dq_, dk, dv] = unpack(q_given.has_value() ? OptionalTensor(dq) : std::nullopt, dpacked);
    mha_bwd(t[0].toTensor(), q, k, v, t[3].toTensor(), t[4].toTensor(), t[5].toOptional<Tensor>(),
            t[6].toOptional<Tensor>(), t[7].toOptional<Tensor>(), options, dq_, dk, dv);
    set_outputs(*stack, 8, std::move(dq), std::move(dpacked));
}

// softmax_lse (and rng_state, s_dmask) carry no gradient: the Autograd kernels return them detached, and no gradient is
// materialized for it (a zero-fill per backward). Marking it non-differentiable instead would
// break compiled autograd, which asserts that no output is so marked.
void keep_options(AutogradContext *ctx, const AttentionOptions &options) {
    ctx->set_materialize_grads(false);
    options.save(ctx);
}

// save_for_backward takes tensors; an absent one is saved undefined.
Tensor or_undefined(const OptionalTensor &t) { return t.value_or(Tensor()); }
OptionalTensor or_none(const Tensor &t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

// Saves q, k, v, out, softmax_lse, rng_state (and cu_seqlens): no seqlen^2 buffer.
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
    static variable_list forward(AutogradContext *ctx, const Tensor &q, const Tensor &k, const Tensor &v,
                                 const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                 const AttentionOptions &options) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        static const c10::OperatorHandle fwd_op = op_handle("flash_attn_cuda::fwd");
        const Stack outputs = call_op(fwd_op, options, q, k, v, cu_seqlens_q, cu_seqlens_k);
        const Tensor out = outputs[0].toTensor(), softmax_lse = outputs[1].toTensor(),
                     rng_state = outputs[2].toTensor();
        ctx->save_for_backward(
            {q, k, v, out, softmax_lse, or_undefined(cu_seqlens_q), or_undefined(cu_seqlens_k), rng_state});
        keep_options(ctx, options);
        return {out, softmax_lse, rng_state, outputs[3].toTensor()};
    }

    // One gradient per forward argument (q, k, v, cu_seqlens_q, cu_seqlens_k, options); none at all
    // when out got none (only softmax_lse was used).
    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list input_grads(6);
        if (grads[0].defined()) {
            static const c10::OperatorHandle bwd_op = op_handle("flash_attn_cuda::bwd");
            const variable_list saved = ctx->get_saved_variables();
            const Stack dqkv = call_op(bwd_op, AttentionOptions::saved(ctx), grads[0], saved[0], saved[1], saved[2],
                                       saved[3], saved[4], or_none(saved[5]), or_none(saved[6]), saved[7]);
            for (int i = 0; i < 3; ++i) {
                input_grads[i] = dqkv[i].toTensor();
            }
        }
        return input_grads;
    }
};

// Saves q (if given), the packed tensor, out, softmax_lse and rng_state (and cu_seqlens).
struct PackedAttentionFunction : torch::autograd::Function<PackedAttentionFunction> {
    static variable_list forward(AutogradContext *ctx, const OptionalTensor &q, const Tensor &packed,
                                 const OptionalTensor &cu_seqlens_q, const OptionalTensor &cu_seqlens_k,
                                 const AttentionOptions &options) {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        static const c10::OperatorHandle fwd_op = op_handle("flash_attn_cuda::packed_fwd");
        const Stack outputs = call_op(fwd_op, options, q, packed, cu_seqlens_q, cu_seqlens_k);
        const Tensor out = outputs[0].toTensor(), softmax_lse = outputs[1].toTensor(),
                     rng_state = outputs[2].toTensor();
        ctx->save_for_backward({or_undefined(q), packed, out, softmax_lse, or_undefined(cu_seqlens_q),
                                or_undefined(cu_seqlens_k), rng_state});
        keep_options(ctx, options);
        return {out, softmax_lse, rng_state, outputs[3].toTensor()};
    }

    // Gradients for (q, packed, cu_seqlens_q, cu_seqlens_k, options).
    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list input_grads(5);
        if (grads[0].defined()) {
            static const c10::OperatorHandle bwd_op = op_handle("flash_attn_cuda::packed_bwd");
            const variable_list saved = ctx->get_saved_variables();
            const Stack grads_out = call_op(bwd_op, AttentionOptions::saved(ctx), grads[0], or_none(saved[0]),
                                            saved[1], saved[2], saved[3], or_none(saved[4]), or_none(saved[5]),
                                            saved[6]);
            if (saved[0].defined()) {
                input_grads[0] = grads_out[0].toTensor();
            }
            input_grads[1] = grads_out[1].toTensor();
        }
        return input_grads;
    }
};

void fwd_autograd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 5);
    const variable_list outputs = AttentionFunction::apply(t[0].toTensor(), t[1].toTensor(), t[2].toTensor(),
                                                           t[3].toOptional<Tensor>(), t[4].toOptional<Tensor>(), options);
    set_outputs(*stack, 5, outputs[0], outputs[1].detach(), outputs[2].detach(), outputs[3].detach());
}

void packed_fwd_autograd(const c10::OperatorHandle &, c10::DispatchKeySet, Stack *stack) {
    const auto [t, options] = boxed_args(*stack, 4);
    const variable_list outputs = PackedAttentionFunction::apply(t[0].toOptional<Tensor>(), t[1].toTensor(),
                                                                 t[2].toOptional<Tensor>(), t[3].toOptional<Tensor>(),
                                                                 options);
    set_outputs(*stack, 4, outputs[0], outputs[1].detach(), outputs[2].detach(), outputs[3].detach());
}

std::string schema(const char *head, const char *returns) {
    return std::string(head) + AttentionOptions::kSchema + ") -> " + returns;
}

template <auto kernel>
torch::CppFunction boxed() {
    return torch::CppFunction::makeFromBoxedFunction<kernel>();
}

void impl_kernels(torch::Library &m) {
    m.impl("fwd", boxed<fwd>());
    m.impl("bwd", boxed<bwd>());
    m.impl("packed_fwd", boxed<packed_fwd>());
    m.impl("packed_bwd", boxed<packed_bwd>());
}

}  // namespace

TORCH_LIBRARY(flash_attn_cuda, m) {
    // Where torch looks for the fake implementations when an op is traced before _extension.load().
    m.set_python_module("flash_attn_cuda.fake_ops");
    // The forwards draw from torch's CUDA generator when dropout is on: not to be deduplicated.
    const std::vector<at::Tag> seeded{at::Tag::nondeterministic_seeded};
    m.def(schema("fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, ",
                 "(Tensor out, Tensor softmax_lse, Tensor rng_state, Tensor s_dmask)")
              .c_str(),
          seeded);
    m.def(schema("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
                 "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? rng_state, ",
                 "(Tensor dq, Tensor dk, Tensor dv)")
              .c_str());
    m.def(schema("packed_fwd(Tensor? q, Tensor packed, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, ",
                 "(Tensor out, Tensor softmax_lse, Tensor rng_state, Tensor s_dmask)")
              .c_str(),
          seeded);
    m.def(schema("packed_bwd(Tensor dout, Tensor? q, Tensor packed, Tensor out, Tensor softmax_lse, "
                 "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? rng_state, ",
                 "(Tensor dq, Tensor dpacked)")
              .c_str());
}

// On the CPU the same kernels run the argument checks, which end in a clear error (the kernels
// need a CUDA tensor), so that bad input raises the same exception wherever it is.
TORCH_LIBRARY_IMPL(flash_attn_cuda, CUDA, m) { impl_kernels(m); }
TORCH_LIBRARY_IMPL(flash_attn_cuda, CPU, m) { impl_kernels(m); }

// The backward ops have no derivative: a double backward through them raises instead of
// silently giving no gradient.
TORCH_LIBRARY_IMPL(flash_attn_cuda, Autograd, m) {
    m.impl("fwd", boxed<fwd_autograd>());
    m.impl("packed_fwd", boxed<packed_fwd_autograd>());
    m.impl("bwd", torch::autograd::autogradNotImplementedFallback());
    m.impl("packed_bwd", torch::autograd::autogradNotImplementedFallback());
}
