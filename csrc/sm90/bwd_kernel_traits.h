// Compile-time shape of the Hopper backward: warp roles, wgmma atoms, shared-memory layouts,
// pipelines and TMA copy types for one (element type, head dim).
//
// A block owns kBlockN keys of one (batch, head), K_j and V_j in shared memory for its whole life,
// and walks the Q blocks that see them (Algorithm 2, lines 6-7 onwards, the loops swapped as in the
// paper's backward). Each consumer warpgroup owns 64 of the keys and computes with them transposed,
// S^T = K Q^T and dP^T = V dO^T (keys along wgmma's M), so that P^T and dS^T leave the accumulator
// as the register A operands of dV += P^T dO and dK += dS^T Q. dQ = dS K needs dS with the queries
// along M: dS^T goes through shared memory; the two warpgroups split dQ's columns (d >= 128), or
// each adds its own keys' share of all of them (d = 64).
//
// d = 256 (kSplitHeadDim): dK and dV of 64 keys would take 256 registers per thread, so the block
// has 64 keys, both warpgroups compute S^T and dP^T for all of them (the same two GEMMs in each:
// 7 GEMM units of work per step where 5 are needed) and each owns half of dK's and dV's columns.
// dQ's partial then has no room in shared memory (Q and dO's two stages take 128 KB, K and V
// 64 KB): each thread adds its values from registers.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "sm90/bwd_config.h"
#include "sm90/bwd_dropout.h"
#include "sm90/tile_queue.h"
#include "sm90/warpgroup_registers.h"

namespace flash::sm90 {

using namespace cute;

// Named barriers of the backward's consumers (CUTLASS offsets the ids past its reserved ones).
enum class BwdBarrier : uint32_t {
    kDsWritten = 0,          // both consumer warpgroups: dS^T of this Q block is in shared memory
    kDqStagingOfWarpgroup0 = 1,  // per warpgroup: its dQ staging buffer (1 and 2)
    kDropoutBytesOfWarpgroup0 = 3,  // per warpgroup: dropout's mask of this tile (3 and 4)
    kTurnOfWarpgroup0 = 5,  // d = 64: the warpgroups' GEMM turns (warpgroup_turns.h; 5 and 6)
};

template <typename Element_, int kHeadDim_>
struct BwdKernelTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = sm90_bwd_block_m;  // query rows per step
    static constexpr int kBlockN = sm90_bwd_block_n(kHeadDim);  // keys per tile
    static constexpr int kStages = 2;    // Q and dO buffers
    static_assert(kHeadDim % 64 == 0 && (kHeadDim <= 128 || kHeadDim == 256),
                  "registers: dK and dV live in the consumers");

    static constexpr int kNumConsumerWarpgroups = 2;
    static constexpr int kNumConsumerThreads = kNumConsumerWarpgroups * 128;
    // One barrier of each per-warpgroup kind per consumer warpgroup, apart, within the 16 ids
    // (CUTLASS's NamedBarrier adds its 8 reserved ones).
    static_assert(uint32_t(BwdBarrier::kDqStagingOfWarpgroup0) + kNumConsumerWarpgroups <=
                      uint32_t(BwdBarrier::kDropoutBytesOfWarpgroup0) &&
                  uint32_t(BwdBarrier::kDropoutBytesOfWarpgroup0) + kNumConsumerWarpgroups <=
                      uint32_t(BwdBarrier::kTurnOfWarpgroup0) &&
                  uint32_t(BwdBarrier::kTurnOfWarpgroup0) + kNumConsumerWarpgroups +
                          cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                      cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers);
    static constexpr bool kSplitHeadDim = kHeadDim > 128;
    // The threads of one S^T tiling (each warpgroup its own keys, or each all of them), and the
    // columns of dK and dV a warpgroup owns.
    static constexpr int kScoreThreads = kSplitHeadDim ? 128 : kNumConsumerThreads;
    static constexpr int kDkvCols = kSplitHeadDim ? kHeadDim / 2 : kHeadDim;
    static constexpr int kNumThreads = kNumConsumerThreads + 128;
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    static_assert(registers_fit(kProducerRegs, kConsumerRegs, kNumConsumerThreads));  // warpgroup_registers.h

    using BlockM = Int<kBlockM>;
    using BlockN = Int<kBlockN>;
    using HeadDim = Int<kHeadDim>;

    // S^T = K Q^T and dP^T = V dO^T: (keys, queries), both operands K-major in shared memory.
    using TiledMmaSdP = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlockM, HeadDim>>(),
        Layout<Shape<Int<kScoreThreads / 128>, _1, _1>>{}));
    // dV += P^T dO and dK += dS^T Q: (keys, a warpgroup's head dim columns), A from registers, dO and
    // Q read as MN-major (head dim, queries) views.
    using TiledMmaDKV = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kDkvCols>, BlockM>, GMMA::Major::K,
                             GMMA::Major::MN>(),
        Layout<Shape<Int<kScoreThreads / 128>, _1, _1>>{}));
    // dQ = dS K: (queries, head dim), dS from the MN-major (queries, keys) buffer, K as the
    // MN-major (head dim, keys) view. Split columns: warpgroup w computes columns
    // [w, w + 1) * kHeadDim / 2 over all keys; an MN-major operand's N must span whole 64-element
    // swizzle atoms, so d = 64 instead gives each warpgroup all columns over its own 64 keys, and
    // both partials are added to the accumulator.
    static constexpr bool kDqSplitColumns = sm90_bwd_dq_split_columns(kHeadDim);
    static constexpr int kDqKeys = kDqSplitColumns ? kBlockN : 64;  // the K of a warpgroup's dQ GEMM
    static constexpr int kDqThreads = kDqSplitColumns ? kNumConsumerThreads : 128;  // one dQ tiling
    using TiledMmaDQ = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float,
                             Shape<_64, Int<kDqSplitColumns ? kHeadDim / 2 : kHeadDim>, Int<kDqKeys>>,
                             GMMA::Major::MN, GMMA::Major::MN>(),
        Layout<Shape<_1, Int<kDqThreads / 128>, _1>>{}));

    // Rows-by-head-dim buffers, K-major as the TMA writes them; the MN-major (head dim, rows) views
    // of the same bytes tile the swizzle atoms along the rows first, as the K-major layout does.
    template <int kRows, int kDepth>
    using SmemRows = decltype(tile_to_shape(
        cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kRows>, HeadDim>(),
        Shape<Int<kRows>, HeadDim, Int<kDepth>>{}));
    template <int kRows, int kDepth>
    using SmemRowsT = decltype(tile_to_shape(
        cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, HeadDim, Int<kRows>>(),
        Shape<HeadDim, Int<kRows>, Int<kDepth>>{}, Step<_2, _1, _3>{}));
    using SmemLayoutQ = SmemRows<kBlockM, kStages>;   // Q and dO
    using SmemLayoutQt = SmemRowsT<kBlockM, kStages>;
    using SmemLayoutK = SmemRows<kBlockN, 1>;         // K and V
    using SmemLayoutKt = SmemRowsT<kBlockN, 1>;
    // dS^T as dQ's A: (queries, keys), queries contiguous; two buffers (see the consumer).
    using SmemLayoutDs = decltype(tile_to_shape(
        cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, BlockM, BlockN>(),
        Shape<BlockM, BlockN, _2>{}));

    using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
    using PipelineState = typename PipelineQ::PipelineState;

    static constexpr uint32_t kRowsBytes = kBlockM * kHeadDim * sizeof(Element);
    static constexpr uint32_t kRowStatBytes = kBlockM * sizeof(float);
    // Each Q (dO) stage brings the Q block's log2-scaled logsumexp (D = rowsum(dO o O)) along.
    static constexpr uint32_t kStageBytes = kRowsBytes + kRowStatBytes;
    static constexpr uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(Element);
    // One warpgroup's dQ partial in fp32, in its register order (bwd_dq.h), staged in shared memory
    // for one bulk reduction (not deterministic: started a step later, under the next Q block's
    // first GEMMs), or (kSplitHeadDim) added from registers.
    static constexpr int kDqWarpgroupFloats = kBlockM * kHeadDim / (kDqThreads / 128);
    static constexpr bool kDqStaged = !kSplitHeadDim;
    // Per warpgroup (bwd_dq.h): two where shared memory has room (d = 64; at d = 128 a second would
    // pass 227 KB).
    static constexpr int kDqStagingBuffers = kHeadDim <= 64 ? 2 : 1;

    struct SharedStorage {
        // 1024-byte alignment: the 128-byte swizzle pattern repeats every 1024 bytes.
        cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
        cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> v;
        cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
        cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> d_o;
        cute::array_aligned<Element, cosize_v<SmemLayoutDs>, 1024> ds;
        cute::array_aligned<float, kDqStaged ? kDqWarpgroupFloats * kNumConsumerWarpgroups * kDqStagingBuffers : 1, 128>
            dq;
        cute::array_aligned<float, kBlockM * kStages, 16> lse_log2;
        cute::array_aligned<float, kBlockM * kStages, 16> dot_do_o;  // D
        int *dq_pending[kNumConsumerWarpgroups];  // deterministic dQ (bwd_dq.h)
        // Dropout's mask per warpgroup, two tiles (bwd_dropout.h; the buffer alternates as dS^T's).
        cute::array_aligned<uint8_t, kDropoutTileBytes * 2 * kNumConsumerWarpgroups, 16> dropout_bytes;
        typename PipelineQ::SharedStorage pipeline_q;
        typename PipelineQ::SharedStorage pipeline_do;
        uint64_t kv_full;   // K and V landed (TMA transaction barrier)
        uint64_t kv_empty;  // every consumer thread is done with K and V (the tile's last GEMM waited for)
        TileRing tile_ring;  // the tiles' indices, producer to consumers, where they come from a counter
    };
    static constexpr int kSmemBytes = sizeof(SharedStorage);
    static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

    // Global tensors as the TMA sees them: (seqlen, head dim, heads, batch).
    using ShapeRows = Shape<int32_t, HeadDim, int32_t, int32_t>;
    using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
    using TmaRows = decltype(make_tma_copy(
        SM90_TMA_LOAD{},
        make_tensor(make_gmem_ptr(static_cast<Element const *>(nullptr)), ShapeRows{}, StrideRows{}),
        SmemLayoutQ{}(_, _, _0{})));
    using TmaKV = decltype(make_tma_copy(
        SM90_TMA_LOAD{},
        make_tensor(make_gmem_ptr(static_cast<Element const *>(nullptr)), ShapeRows{}, StrideRows{}),
        SmemLayoutK{}(_, _, _0{})));
};

}  // namespace flash::sm90
