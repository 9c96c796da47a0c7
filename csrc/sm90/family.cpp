// The Hopper family's host entry points (sm90/family.h).
#include "sm90/family.h"

#include "common/dispatch.h"
#include "sm90/fwd_tile_config.h"
#include "sm90/fwd_workspace.h"
#include "sm90/launch.h"

namespace flash::sm90 {

// Tensors broadcast along the sequence (a row stride of 0 over more than one row) run on the FA2
// family: a TMA descriptor cannot describe them. So do dropout's probabilities (return_attn_probs),
// which this family does not write, and dropout at head dims whose KV blocks are not 64-key multiples.
bool supports_fwd(const Flash_fwd_params &params) {
    if (has_dropout(params) && (params.return_softmax || !sm90_fwd_supports_dropout(params.head_dim))) {
        return false;
    }
    const bool varlen = params.cu_seqlens_q != nullptr;
    const int rows_q = varlen ? params.total_q : params.seqlen_q, rows_k = varlen ? params.total_k : params.seqlen_k;
    auto describable = [](int64_t row_stride, int rows) { return row_stride != 0 || rows <= 1; };
    if (!describable(params.q_row_stride, rows_q) || !describable(params.o_row_stride, rows_q) ||
        !describable(params.k_row_stride, rows_k) || !describable(params.v_row_stride, rows_k)) {
        return false;
    }
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, []<int>() {});
    });
}

size_t fwd_workspace_bytes(const Flash_fwd_params &params) { return fwd_workspace_size(params.is_causal); }

bool run_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, [&]<int kHeadDim>() {
            (params.is_causal ? run_mha_fwd_sm90<Element, kHeadDim, true>
                              : run_mha_fwd_sm90<Element, kHeadDim, false>)(params, stream);
        });
    });
}

}  // namespace flash::sm90
