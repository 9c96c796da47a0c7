// Varlen problems: a TMA descriptor per sequence and loaded tensor, whose rows are that sequence's
// alone. Through the packed tensor's descriptor, a tile that ends inside a block (or, causal, starts
// above its sequence) loads the neighbouring sequence's rows, which the GEMMs multiply by zeros; an
// inf or NaN there would reach this sequence's results (0 * inf is NaN). With the sequence's own
// extent the TMA fills those rows with zeros, as the FA2 family's predicated loads do. Paged K and V
// (paged_keys.h): a sequence's descriptor spans the page of its last key, up to that key. The
// forward's split-block kernels zero V's rows past a sequence in shared memory instead
// (fwd_split_blocks.h) and use none.
// A small kernel builds the descriptors from the packed ones before each main kernel, into the
// workspace (workspace.h); the load thread acquires each before its first load through it. It is
// launched dependent on the kernel before it (which may have written cu_seqlens) and lets the
// main kernel's blocks start under it (dependent_launch.h).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include <cute/tensor.hpp>

#include "common/block_info.h"
#include "common/dependent_launch.h"
#include "common/flash.h"
#include "sm90/paged_keys.h"
#include "sm90/workspace.h"

namespace flash::sm90 {

using cute::TmaDescriptor;

// The workspace is sized in kTensorMapBytes per descriptor (workspace.h); the kernels index it
// by the type.
static_assert(sizeof(TmaDescriptor) == kTensorMapBytes);

// The TMA dimension that coordinate mode kMode of a TMA copy's tensor feeds: the j of the basis E<j>
// that make_tma_copy gave the mode.
template <class Basis>
struct TmaDimOfBasis;
template <int kDim>
struct TmaDimOfBasis<cute::ScaledBasis<cute::Int<1>, kDim>> {
    static constexpr int value = kDim;
};
template <class Tma, int kMode>
constexpr int tma_dim_of_mode =
    TmaDimOfBasis<cute::remove_cvref_t<decltype(cute::get<kMode>(std::declval<Tma>().aux_params_.g_stride_))>>::value;

// One loaded tensor as the builder sees it: its packed descriptor, the address of its row 0, the
// bytes from row to row, and whether cu_seqlens_q (else cu_seqlens_k) counts its rows.
struct PackedTensor {
    TmaDescriptor desc;
    char const *ptr;
    int64_t row_bytes;
    bool rows_of_q;
};

template <class Element, class Tma>
PackedTensor packed_tensor(Tma const &tma, void const *ptr, int64_t row_stride, bool rows_of_q) {
    return {*tma.get_tma_descriptor(), static_cast<char const *>(ptr), row_stride * int64_t(sizeof(Element)),
            rows_of_q};
}

template <int kTensors>
struct SequenceMapsArgs {
    Flash_fwd_params params;  // cu_seqlens and the clamps of BlockInfo
    PackedTensor tensors[kTensors];
    TmaDescriptor *maps;  // [batch][kTensors]
};

// Tensor t's row extent: the dimension is an immediate of the instruction.
template <int kDim, int... kRest>
__device__ __forceinline__ void replace_row_extent(TmaDescriptor *map, int t, int rows) {
    if (t == 0) {
        asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], %1, %2;" ::"l"(map), "n"(kDim),
                     "r"(rows)
                     : "memory");
    } else if constexpr (sizeof...(kRest) > 0) {
        replace_row_extent<kRest...>(map, t - 1, rows);
    }
}

// kRowDims: the TMA dimension of each tensor's rows (tma_dim_of_mode).
template <int... kRowDims>
__global__ void build_sequence_tensor_maps_kernel(__grid_constant__ const SequenceMapsArgs<sizeof...(kRowDims)> args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    allow_next_grid();
    wait_for_previous_grid();
    constexpr int kTensors = sizeof...(kRowDims);
    const int index = blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= args.params.batch * kTensors) {
        return;
    }
    const int bidb = index / kTensors, t = index % kTensors;
    const BlockInfo binfo(args.params, bidb);
    const PackedTensor &src = args.tensors[t];
    TmaDescriptor *map = args.maps + index;
    static_assert(sizeof(TmaDescriptor) % sizeof(uint4) == 0);
    for (int i = 0; i < int(sizeof(TmaDescriptor) / sizeof(uint4)); ++i) {
        reinterpret_cast<uint4 *>(map)[i] = reinterpret_cast<uint4 const *>(&src.desc)[i];
    }
    int start = src.rows_of_q ? binfo.q_start : binfo.k_start;
    int rows = src.rows_of_q ? binfo.seqlen_q : binfo.seqlen_k;
    const PagedKeys pages(args.params, binfo.k_start);
    if (!src.rows_of_q && pages.paged() && rows > 0) {
        // Paged: the page of the sequence's last key, up to that key (paged_keys.h).
        const int tail = pages.tail_key(rows);
        start = pages.row(tail, pages.entry(tail));
        rows -= tail;
    }
    // An empty sequence's descriptor is never loaded from, but its extent must be positive.
    rows = max(rows, 1);
    asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;" ::"l"(map),
                 "l"(src.ptr + start * src.row_bytes)
                 : "memory");
    replace_row_extent<kRowDims...>(map, t, rows);
    asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
#endif
}

// The descriptors of every sequence of a varlen problem, at workspace + kSequenceMapsOffset.
template <int... kRowDims>
TmaDescriptor *build_sequence_tensor_maps(Flash_fwd_params const &params, void *workspace,
                                          PackedTensor const (&tensors)[sizeof...(kRowDims)], cudaStream_t stream) {
    constexpr int kTensors = sizeof...(kRowDims);
    SequenceMapsArgs<kTensors> args{params, {}, reinterpret_cast<TmaDescriptor *>(
                                                    static_cast<char *>(workspace) + kSequenceMapsOffset)};
    for (int t = 0; t < kTensors; ++t) {
        args.tensors[t] = tensors[t];
    }
    constexpr int kThreads = 128;
    const int blocks = (params.batch * kTensors + kThreads - 1) / kThreads;
    launch_dependent(build_sequence_tensor_maps_kernel<kRowDims...>, dim3(blocks), dim3(kThreads), 0, stream, args);
    return args.maps;
}

// The load thread's view: the descriptors of a tile's sequence (varlen), else the packed ones. A
// block must acquire a descriptor that an earlier kernel wrote before its first load through it;
// the acquire holds for the rest of the kernel. Acquiring costs about a microsecond of the load
// thread's time (runs 292-295), so it is done only when the sequence differs from the previous
// load's through that tensor, and where a wait for the consumers follows, which then hides it (all
// of a block's descriptors at its start cost 1.7-2.4x the time of a backward of 256 short
// sequences, whose varlen grid has a block per tile).
template <int kTensors>
class SequenceTensorMaps {
  public:
    __device__ explicit SequenceTensorMaps(TmaDescriptor const *maps) : maps_(maps) {
        for (int t = 0; t < kTensors; ++t) {
            acquired_[t] = -1;
        }
    }

    __device__ bool per_sequence() const { return maps_ != nullptr; }

    // The TMA row of a sequence's first row: 0 in its own descriptor, else its row in the packed one.
    __device__ int first_row(int packed_row) const { return per_sequence() ? 0 : packed_row; }

    // Acquires sequence bidb's descriptor of tensor t (per_sequence() only). t: a constant, so that
    // the sequences acquired stay in registers.
    __device__ __forceinline__ void acquire(int t, int bidb) {
        if (acquired_[t] != bidb) {
            acquired_[t] = bidb;
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map(t, bidb)) : "memory");
        }
    }

    // Tensor t's descriptor for sequence bidb, acquired, or the packed one.
    __device__ __forceinline__ TmaDescriptor const *get(int t, int bidb, TmaDescriptor const *packed) {
        if (maps_ == nullptr) {
            return packed;
        }
        acquire(t, bidb);
        return map(t, bidb);
    }

  private:
    __device__ TmaDescriptor const *map(int t, int bidb) const { return maps_ + bidb * kTensors + t; }

    TmaDescriptor const *maps_;
    int acquired_[kTensors];
};

}  // namespace flash::sm90
