// The Hopper family's global scratch memory, in both directions (Flash_fwd_params::fwd_workspace,
// Flash_bwd_params::bwd_scratch): the counter from which the blocks take their tiles under the
// dynamic schedule (tile_queue.h) in the first slot, then, for varlen problems, a TMA descriptor per
// sequence and loaded tensor (sequence_tensor_maps.h). Plain C++, for the host code (family.cpp, the
// standalone harness) as well as the kernels.
#pragma once

#include <cstddef>

namespace flash::sm90 {

// Causal tiles see from one KV block to all of them, so the blocks take them one at a time from a
// counter; non-causal tiles cost about the same (less at a window's or a padded sequence's ends),
// and the static schedule's rotated rounds hand them out about as evenly (runs 194-195: the counter
// was within 3% of them on windows, and cost 1-2% at long plain sequences).
// A causal window runs on the causal kernel, and so is scheduled dynamically too.
constexpr bool dynamic_tiles(bool is_causal) { return is_causal; }

// 64 bits, as the tile indices: a varlen grid counts batch x the longest sequence's row blocks.
using TileCounter = unsigned long long;

// A TMA descriptor's size, and the alignment the tensormap instructions need.
constexpr size_t kTensorMapBytes = 128;

// The descriptors per sequence: V (forward); Q, dO, K and V (backward).
constexpr int kFwdSequenceMaps = 1;
constexpr int kBwdSequenceMaps = 4;

// Where the descriptors start in a workspace: the counter has the first slot.
constexpr size_t kSequenceMapsOffset = kTensorMapBytes;

// Bytes for the counter (when the schedule is dynamic) and maps_per_sequence descriptors of each of
// varlen_sequences (0: not varlen). The counter is zeroed by the launchers before every kernel.
constexpr size_t workspace_size(bool counter, int varlen_sequences, int maps_per_sequence) {
    return varlen_sequences > 0 ? kSequenceMapsOffset + kTensorMapBytes * size_t(varlen_sequences) * maps_per_sequence
           : counter            ? sizeof(TileCounter)
                                : 0;
}

constexpr size_t fwd_workspace_size(bool is_causal, int varlen_sequences) {
    return workspace_size(dynamic_tiles(is_causal), varlen_sequences, kFwdSequenceMaps);
}

}  // namespace flash::sm90
