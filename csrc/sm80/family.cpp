// The sm80 family's host entry points (sm80/family.h).
#include "sm80/family.h"

#include "common/dispatch.h"
#include "sm80/bwd_tile_config.h"
#include "sm80/launch.h"

namespace flash::sm80 {

namespace {

// Calls launch.operator()<Element, kHeadDim>() for the params' kernel, if built.
template <class Launch>
bool dispatch(const Flash_fwd_params &params, Launch &&launch) {
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM80_HDIMS>(params.head_dim, [&]<int kHeadDim>() {
            launch.template operator()<Element, kHeadDim>();
        });
    });
}

}  // namespace

bool run_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    return dispatch(params, [&]<typename Element, int kHeadDim>() {
        (params.is_causal ? run_mha_fwd_<Element, kHeadDim, true> : run_mha_fwd_<Element, kHeadDim, false>)(params,
                                                                                                          stream);
    });
}

bool run_bwd(Flash_bwd_params &params, cudaStream_t stream) {
    return dispatch(params, [&]<typename Element, int kHeadDim>() {
        (params.is_causal ? run_mha_bwd_<Element, kHeadDim, true> : run_mha_bwd_<Element, kHeadDim, false>)(params,
                                                                                                          stream);
    });
}

// The fp32 buffers give each sequence its rows rounded up to a multiple of block_m: padded, per
// (batch, head); varlen, per head, sequence b starting near row cu_seqlens_q[b] + b * block_m
// (BlockInfo::accum_row0).
BwdWorkspace bwd_workspace(const Flash_bwd_params &params, bool deterministic) {
    const int block_m = bwd_tile_config(params.head_dim).block_m;
    const int m_blocks = (params.seqlen_q + block_m - 1) / block_m;
    const bool varlen = params.cu_seqlens_q != nullptr;
    BwdWorkspace ws{};
    ws.accum_rows = varlen ? params.total_q + params.batch * block_m : m_blocks * block_m;
    const int64_t row_sets = varlen ? params.num_heads : int64_t(params.batch) * params.num_heads;
    ws.softmax_d_floats = row_sets * ws.accum_rows;
    ws.dq_accum_floats = ws.softmax_d_floats * params.head_dim;
    ws.semaphore_ints = deterministic ? int64_t(params.batch) * params.num_heads * m_blocks : 0;
    return ws;
}

int bwd_smem_bytes(int head_dim) { return bwd_smem_bytes(bwd_tile_config(head_dim), head_dim); }

}  // namespace flash::sm80
