// Dropout's state on the API side: the Philox seed and offset drawn from torch's CUDA generator for
// a forward, handed to the kernels (common/dropout.h), and kept for the backward in rng_state.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "api/checks.h"
#include "api/options.h"
#include "common/flash.h"

struct FwdDropoutTensors {
    // int64 (seed, offset) the forward kernel writes; empty without dropout.
    at::Tensor rng_state;
    // return_softmax with dropout: (batch, nheads, seqlen_q, seqlen_k rounded up to 128) in q's
    // dtype, zeroed (the tiles a kernel skips stay 0); else empty.
    at::Tensor s_dmask;
};

// With dropout, reserves this forward's Philox offsets in q's device's default generator (so that
// torch.manual_seed reproduces a run, and graph capture replays draw fresh ones) and sets params.
FwdDropoutTensors set_fwd_dropout(Flash_fwd_params &params, const Problem &p, const AttentionOptions &options,
                                  const at::Tensor &q);

// The backward regenerates the forward's mask from the rng_state the forward returned.
void set_bwd_dropout(Flash_bwd_params &params, const std::optional<at::Tensor> &rng_state, const at::Tensor &q);
