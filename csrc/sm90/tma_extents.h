// The rows and batches of a problem's tensors as the TMA sees them (plain C++, for family.cpp's
// checks and the kernels' descriptors, tma_tensors.h): padded, seqlen rows per batch; varlen, the
// packed (total, heads, head dim) tensors as one batch, a sequence found by its row offset
// (tma_sequence); paged K and V, their pages' rows (paged_keys.h).
#pragma once

#include "common/flash.h"

namespace flash::sm90 {

struct TmaRowExtents {
    int rows_q, rows_k, batch;
};

inline TmaRowExtents tma_row_extents(Flash_fwd_params const &p) {
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int rows_k = p.block_table != nullptr ? p.stored_rows_k : varlen ? p.total_k : p.seqlen_k;
    return {varlen ? p.total_q : p.seqlen_q, rows_k, varlen ? 1 : p.batch};
}

}  // namespace flash::sm90
