// The Hopper family's host entry points (sm90/family.h).
#include "sm90/family.h"

#include "common/dispatch.h"
#include "sm90/bwd_config.h"
#include "sm90/fwd_tile_config.h"
#include "sm90/workspace.h"
#include "sm90/launch.h"
#include "sm90/tile_scheduler.h"
#include "sm90/tma_extents.h"

namespace flash::sm90 {

// Tensors broadcast along the sequence (a row stride of 0 over more than one row) run on the FA2
// family: a TMA descriptor cannot describe them. So do dropout's probabilities (return_attn_probs),
// which this family does not write, dropout at head dims whose KV blocks are not 64-key multiples,
// forwards of ~2^31 tiles or more, whose indices the tile scheduler does not decode, and paged K and
// V whose key blocks would cross pages (the FA2 family reads no pages: the API gathers them).
namespace {

bool describable(int64_t row_stride, int rows) { return row_stride != 0 || rows <= 1; }

bool describable_rows(const Flash_fwd_params &params) {
    const TmaRowExtents e = tma_row_extents(params);
    return describable(params.q_row_stride, e.rows_q) && describable(params.o_row_stride, e.rows_q) &&
           describable(params.k_row_stride, e.rows_k) && describable(params.v_row_stride, e.rows_k);
}

}  // namespace

bool supports_fwd(const Flash_fwd_params &params) {
    if (has_dropout(params) && (params.return_softmax || !sm90_fwd_supports_dropout(params.head_dim))) {
        return false;
    }
    if (!describable_rows(params)) {
        return false;
    }
    if (params.block_table != nullptr &&
        !sm90_fwd_supports_pages(params.head_dim, params.page_size, params.page_stride)) {
        return false;
    }
    // Grids of ~2^31 tiles or more (varlen: counted at the longest sequence) run on the FA2 family.
    const int block_m = sm90_fwd_tile_config(params.head_dim, /*short_tiles=*/true).block_m;
    if (!tile_indices_fit((params.seqlen_q + block_m - 1) / block_m, params.num_heads, params.batch)) {
        return false;
    }
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, []<int>() {});
    });
}

bool supports_bwd(const Flash_bwd_params &params) {
    if (!describable_rows(params) ||
        !describable(params.do_row_stride, tma_row_extents(params).rows_q)) {
        return false;
    }
    // Tile indices are ints (bwd_block.h; varlen: counted at the longest sequence): larger grids
    // run on the FA2 family.
    const int block_n = sm90_bwd_block_n(params.head_dim);
    if (int64_t((params.seqlen_k + block_n - 1) / block_n) * params.num_heads * params.batch > INT32_MAX) {
        return false;
    }
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_BWD_HDIMS>(params.head_dim, []<int>() {});
    });
}

// Varlen: the mean sequence length stands for the rows a tile walks (seqlen_q is the longest).
bool bwd_pays(const Flash_bwd_params &params, bool deterministic) {
    const int rows = params.cu_seqlens_q != nullptr ? params.total_q / std::max(params.batch, 1) : params.seqlen_q;
    if (deterministic && !sm90_bwd_deterministic_pays(params.head_dim, params.is_causal, rows, params.window_right)) {
        return false;
    }
    return sm90_bwd_pays(params.head_dim, params.is_causal, rows, params.window_left, params.window_right);
}

// Rows rounded up to the backward's 64-row Q blocks per (batch, head), or per head for varlen
// (BlockInfo::accum_row0), so that every Q block's row statistics start 256-byte aligned for the
// bulk copies (bwd_producer.h).
BwdWorkspace bwd_workspace(const Flash_bwd_params &params, bool deterministic) {
    constexpr int kBlockM = sm90_bwd_block_m;
    const bool varlen = params.cu_seqlens_q != nullptr;
    const int rows = varlen ? params.total_q + params.batch * kBlockM : params.seqlen_q;
    BwdWorkspace ws{};
    ws.accum_rows = (rows + kBlockM - 1) / kBlockM * kBlockM;
    ws.softmax_d_floats = int64_t(varlen ? 1 : params.batch) * params.num_heads * ws.accum_rows;
    ws.lse_log2_floats = ws.softmax_d_floats;
    ws.dq_accum_floats = ws.softmax_d_floats * params.head_dim;
    ws.semaphore_ints =
        deterministic ? sm90_bwd_semaphore_ints(params.batch, params.num_heads, params.seqlen_q, params.head_dim) : 0;
    ws.scratch_bytes = workspace_size(sm90_bwd_dynamic_tiles(params.is_causal, deterministic),
                                      varlen ? params.batch : 0, kBwdSequenceMaps);
    return ws;
}

size_t fwd_workspace_bytes(const Flash_fwd_params &params) {
    return fwd_workspace_size(params.is_causal, params.cu_seqlens_q != nullptr ? params.batch : 0);
}

bool run_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, [&]<int kHeadDim>() {
            (params.is_causal ? run_mha_fwd_sm90<Element, kHeadDim, true>
                              : run_mha_fwd_sm90<Element, kHeadDim, false>)(params, stream);
        });
    });
}

bool run_bwd(Flash_bwd_params &params, cudaStream_t stream) {
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_BWD_HDIMS>(params.head_dim, [&]<int kHeadDim>() {
            (params.is_causal ? run_mha_bwd_sm90<Element, kHeadDim, true>
                              : run_mha_bwd_sm90<Element, kHeadDim, false>)(params, stream);
        });
    });
}

}  // namespace flash::sm90
