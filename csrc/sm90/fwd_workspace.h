// The Hopper forward's global scratch memory (Flash_fwd_params::fwd_workspace): the counter from
// which the blocks take their tiles under the dynamic schedule (tile_queue.h). Plain C++, for the
// host code (family.cpp, the standalone harness) as well as the kernel.
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

// Zeroed by the launcher before every kernel (fwd_launch.h).
constexpr size_t fwd_workspace_size(bool is_causal) { return dynamic_tiles(is_causal) ? sizeof(TileCounter) : 0; }

}  // namespace flash::sm90
