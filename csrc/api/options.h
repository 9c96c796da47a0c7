// The attention options of every op, in one struct from the op schema to the kernel parameters: a
// variant adds its schema entry to kSchema, its field here and in the three conversions of
// options.cpp (stack, autograd context, params), then its kernel code and its test.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/SymInt.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "common/flash.h"

struct AttentionOptions {
    // The trailing arguments of every op's schema, in this order.
    static constexpr const char *kSchema =
        "SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, bool causal, int window_left, "
        "int window_right, float softcap, Tensor? alibi_slopes, bool deterministic, float dropout_p, "
        "bool return_softmax";
    static constexpr int kCount = 11;

    // Varlen: at least the longest sequence (ignored for the padded layout).
    c10::SymInt max_seqlen_q, max_seqlen_k;
    double softmax_scale;
    bool causal;
    // The sliding window (flash-attn 2.x window_size): -1 is unbounded; causal sets right to 0.
    int64_t window_left, window_right;
    // softcap > 0 caps the scaled scores (softcap * tanh(s / softcap)); 0 is off.
    double softcap;
    // ALiBi slopes, fp32 (nheads) or (batch, nheads), on q's device; none is off.
    std::optional<at::Tensor> alibi_slopes;
    // The backward accumulates dQ in a fixed order (bitwise reproducible).
    bool deterministic;
    // Dropout on the attention probabilities, in [0, 1); 0 is off.
    double dropout_p;
    // With dropout, the forward also returns the probabilities it dropped from (return_attn_probs).
    bool return_softmax;

    // The last kCount values of an op's arguments; push appends them in schema order.
    static AttentionOptions from_stack(c10::ArrayRef<c10::IValue> args);
    void push(torch::jit::Stack &stack) const;

    // Kept in an autograd context for the backward.
    void save(torch::autograd::AutogradContext *ctx) const;
    static AttentionOptions saved(torch::autograd::AutogradContext *ctx);

    // The options' fields of the kernel parameters, whose shapes are set (checks them first against
    // them and q).
    void set_params(Flash_fwd_params &params, const at::Tensor &q) const;
};
