// The Hopper family's host entry points (sm90/family.h).
#include "sm90/family.h"

#include "common/dispatch.h"
#include "sm90/launch.h"

namespace flash::sm90 {

// Tensors with a row stride of 0 (a broadcast along the sequence) run on the FA2 family: a TMA
// descriptor cannot describe them.
bool supports_fwd(const Flash_fwd_params &params) {
    if (params.q_row_stride == 0 || params.k_row_stride == 0 || params.v_row_stride == 0 || params.o_row_stride == 0) {
        return false;
    }
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, []<int>() {});
    });
}

bool run_fwd(Flash_fwd_params &params, cudaStream_t stream) {
    return dispatch_element(params.is_bf16, [&]<typename Element>() {
        return dispatch_head_dim<FLASH_ATTN_SM90_HDIMS>(params.head_dim, [&]<int kHeadDim>() {
            (params.is_causal ? run_mha_fwd_sm90<Element, kHeadDim, true>
                              : run_mha_fwd_sm90<Element, kHeadDim, false>)(params, stream);
        });
    });
}

}  // namespace flash::sm90
