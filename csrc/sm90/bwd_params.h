// The Hopper backward's kernel argument: the API's parameters plus the TMA descriptors of Q, dO, K
// and V, built on the host from those parameters.
#pragma once

#include <cute/tensor.hpp>

#include "common/flash.h"
#include "sm90/sequence_tensor_maps.h"
#include "sm90/tma_tensors.h"

namespace flash::sm90 {

using namespace cute;

template <class Traits>
struct BwdKernelParams {
    Flash_bwd_params params;
    typename Traits::TmaRows tma_q, tma_do;
    typename Traits::TmaKV tma_k, tma_v;
    typename Traits::ShapeRows shape_q, shape_do, shape_k, shape_v;
    // Varlen: kBwdSequenceMaps descriptors per sequence, in BwdMap's order; else null.
    TmaDescriptor const *sequence_maps;
};

enum BwdMap { kBwdMapQ, kBwdMapDo, kBwdMapK, kBwdMapV };

template <class Traits>
BwdKernelParams<Traits> make_bwd_kernel_params(Flash_bwd_params const &p) {
    using Element = typename Traits::Element;
    const TmaRowExtents e = tma_row_extents(p);
    GmemRows q{p.q_ptr, e.rows_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.num_heads, e.batch};
    GmemRows d_o{p.do_ptr, e.rows_q, p.do_row_stride, p.do_head_stride, p.do_batch_stride, p.num_heads, e.batch};
    GmemRows k{p.k_ptr, e.rows_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.num_heads_k, e.batch};
    GmemRows v{p.v_ptr, e.rows_k, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.num_heads_k, e.batch};
    if (e.rows_k <= 0) {
        // No keys: no tile has work (nor loads through the per-sequence descriptors that varlen
        // builds from these), but a descriptor needs a non-empty tensor.
        k = v = q;
    }
    auto lq = tma_rows_layout<Traits>(q);
    auto ldo = tma_rows_layout<Traits>(d_o);
    auto lk = tma_rows_layout<Traits>(k);
    auto lv = tma_rows_layout<Traits>(v);
    using Source = Element const;
    return {p,
            make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Source>(q.ptr, lq), typename Traits::SmemLayoutQ{}(_, _, _0{})),
            make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Source>(d_o.ptr, ldo), typename Traits::SmemLayoutQ{}(_, _, _0{})),
            make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Source>(k.ptr, lk), typename Traits::SmemLayoutK{}(_, _, _0{})),
            make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<Source>(v.ptr, lv), typename Traits::SmemLayoutK{}(_, _, _0{})),
            lq.shape(),
            ldo.shape(),
            lk.shape(),
            lv.shape(),
            nullptr};
}

// Varlen: each sequence's descriptors of Q, dO, K and V, built on stream into params.bwd_scratch.
template <class Traits>
TmaDescriptor const *build_bwd_sequence_maps(BwdKernelParams<Traits> const &kp, cudaStream_t stream) {
    using Element = typename Traits::Element;
    Flash_bwd_params const &p = kp.params;
    const PackedTensor tensors[kBwdSequenceMaps] = {
        packed_tensor<Element>(kp.tma_q, p.q_ptr, p.q_row_stride, true),
        packed_tensor<Element>(kp.tma_do, p.do_ptr, p.do_row_stride, true),
        packed_tensor<Element>(kp.tma_k, p.k_ptr, p.k_row_stride, false),
        packed_tensor<Element>(kp.tma_v, p.v_ptr, p.v_row_stride, false)};
    constexpr int kRowsDim = tma_dim_of_mode<typename Traits::TmaRows, 0>;
    constexpr int kKeysDim = tma_dim_of_mode<typename Traits::TmaKV, 0>;
    return build_sequence_tensor_maps<kRowsDim, kRowsDim, kKeysDim, kKeysDim>(p, p.bwd_scratch, tensors, stream);
}

}  // namespace flash::sm90
