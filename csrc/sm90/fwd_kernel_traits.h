// Compile-time shape of the Hopper forward: warp roles, wgmma atoms, shared-memory layouts,
// pipelines and the TMA copy types, for one (element type, head dim, tile) choice.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "sm90/tile_queue.h"
#include "sm90/warpgroup_registers.h"

namespace flash::sm90 {

using namespace cute;

// Named barriers of the consumer warpgroups (CUTLASS offsets the ids past its reserved ones).
enum class FwdBarrier : uint32_t {
    // One per consumer warpgroup, among its own threads: around its O's trip through shared memory
    // (fwd_epilogue.h), and the softmax's vote (fwd_consumer.h).
    kOwnOfWarpgroup0 = 0,
    kTurnOfWarpgroup0 = 3,  // warpgroup_turns.h: one per consumer warpgroup
    // Split-block kernels (fwd_split_blocks.h), both consumer warpgroups through one bar.sync each:
    // both are done with the tile's GEMMs; warpgroup 1's partial results are in shared memory.
    kSplitGemmsDone = 5,
    kSplitPartialsReady = 6,
};

// The shared memory of kernels whose O goes out through Q's buffer.
struct NoOBuffer {};

// kOBuffer's hand-over (fwd_epilogue.h): warpgroup w may write the O buffer once free_for[w]
// completes a phase, which the other warpgroup's 128 threads arrive on when done with it. The
// phases count epilogues: both warpgroups run one per tile with work (the same tiles) and every
// thread arrives in each, so warpgroup 0 is at most one epilogue ahead of warpgroup 1.
struct OBufferTurns {
    uint64_t free_for[2];

    __device__ __forceinline__ void init() {
        for (int w = 0; w < 2; ++w) {
            cutlass::arch::ClusterBarrier::init(&free_for[w], 128);
        }
    }
};

// Split-block kernels' exchange (fwd_split_blocks.h): warpgroup 1's row maxima and partial row sums,
// per thread (its 2 accumulator rows).
struct SplitRowStats {
    float row_max[2][128];
    float row_sum[2][128];
};

// kDynamicTiles: the blocks take their tiles from a global counter (tile_queue.h). kSplitBlocks: a
// tile's rows fit in 64 (decoding), and both consumer warpgroups compute them, each over every other
// KV block (fwd_split_blocks.h).
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, bool kDynamicTiles_,
          bool kSplitBlocks_ = false>
struct FwdKernelTraits {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kStages = kStages_;
    static constexpr bool kDynamicTiles = kDynamicTiles_;
    static constexpr bool kSplitBlocks = kSplitBlocks_;

    // Warpgroup 0 loads (one thread issues the TMA copies); warpgroups 1.. compute 64 rows each.
    static constexpr int kNumConsumerWarpgroups = kBlockM / 64;
    static constexpr int kNumConsumerThreads = kNumConsumerWarpgroups * 128;
    static constexpr int kNumThreads = kNumConsumerThreads + 128;
    static_assert(kBlockM % 64 == 0 && kNumConsumerWarpgroups <= 3);
    // One barrier of its own and one turn barrier per consumer warpgroup, apart, within the 16 ids
    // (CUTLASS's NamedBarrier adds its 8 reserved ones).
    static_assert(uint32_t(FwdBarrier::kOwnOfWarpgroup0) + kNumConsumerWarpgroups <=
                      uint32_t(FwdBarrier::kTurnOfWarpgroup0) &&
                  uint32_t(FwdBarrier::kTurnOfWarpgroup0) + kNumConsumerWarpgroups +
                          cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                      cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers);
    // setmaxnreg: the loader gives registers back to the consumers (warpgroup_registers.h).
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = kNumConsumerWarpgroups == 3 ? 160 : 240;
    static_assert(registers_fit(kProducerRegs, kConsumerRegs, kNumConsumerThreads));

    using BlockM = Int<kBlockM>;
    using BlockN = Int<kBlockN>;
    using HeadDim = Int<kHeadDim>;
    using WarpgroupsM = Layout<Shape<Int<kNumConsumerWarpgroups>, _1, _1>>;

    // S = Q K^T: both operands in shared memory, K-major.
    using TiledMmaS = decltype(make_tiled_mma(
        GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlockN, HeadDim>>(), WarpgroupsM{}));
    // O += P V: P from registers, V (kBlockN keys x kHeadDim) read as the MN-major (kHeadDim, kBlockN) B.
    using TiledMmaO = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlockN>, GMMA::Major::K, GMMA::Major::MN>(),
        WarpgroupsM{}));
    static_assert(size<1>(typename TiledMmaS::AtomShape_MNK{}) == kBlockN, "one wgmma spans the KV block");
    static_assert(size<1>(typename TiledMmaO::AtomShape_MNK{}) == kHeadDim, "one wgmma spans the head dim");

    static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);
    static constexpr int kKVStageBytes = kBlockN * kHeadDim * sizeof(Element);
    // Two Q buffers where shared memory allows (227 KB per block): then the next tile's Q loads
    // while this tile runs, and O goes out through this tile's buffer.
    static constexpr int kQStages = 2 * kQBytes + 2 * kStages * kKVStageBytes + 4096 <= 227 * 1024 ? 2 : 1;
    // With one Q buffer (d = 192, 256), O goes out through a buffer of its own for one warpgroup's 64
    // rows, which the two consumer warpgroups take in turn (fwd_epilogue.h), so that Q's buffer is
    // released after the tile's last S and the next tile's Q loads under its last P V and epilogue.
    static constexpr bool kOBuffer = kQStages == 1;
    static_assert(!kOBuffer || kNumConsumerWarpgroups == 2);
    // Warpgroup 1 hands its partial O over in fp32 through the tile's Q buffer, which holds 64 rows of
    // fp32 in 128 of 16-bit elements, and is the tile's until its O has been stored.
    static_assert(!kSplitBlocks || (kNumConsumerWarpgroups == 2 && !kOBuffer && kBlockM == 128));
    static_assert(!kSplitBlocks ||
                  (uint32_t(FwdBarrier::kSplitPartialsReady) + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <
                       cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers &&
                   uint32_t(FwdBarrier::kTurnOfWarpgroup0) + kNumConsumerWarpgroups <=
                       uint32_t(FwdBarrier::kSplitGemmsDone)));

    using SmemLayoutAtomQ =
        decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, BlockM, HeadDim>());
    using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtomQ{}, Shape<BlockM, HeadDim, Int<kQStages>>{}));
    using SmemLayoutK = decltype(tile_to_shape(
        cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, BlockN, HeadDim>(),
        Shape<BlockN, HeadDim, Int<kStages>>{}));
    // V^T: (kHeadDim, kBlockN) with the head dim contiguous, the swizzle atoms tiled along the keys
    // first so that each 64-column slab of the head dim is one TMA box.
    using SmemLayoutVt = decltype(tile_to_shape(
        cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, HeadDim, BlockN>(),
        Shape<HeadDim, BlockN, Int<kStages>>{}, Step<_2, _1, _3>{}));
    // O goes out through its tile's Q buffer (or kOBuffer's), each warpgroup's 64 rows once its
    // last S = Q K^T is done, as boxes of 64 rows by one swizzle atom's columns (contiguous in Q's
    // layout, whose atoms run down the rows first).
    static constexpr int kOBoxCols = size<1>(SmemLayoutAtomQ{});
    using SmemLayoutOBox = decltype(tile_to_shape(SmemLayoutAtomQ{}, Shape<_64, Int<kOBoxCols>>{}));
    using SmemLayoutO = decltype(tile_to_shape(SmemLayoutAtomQ{}, Shape<_64, HeadDim>{}));  // kOBuffer
    // One warpgroup's O += P V, for its 64 rows of the O buffer.
    using TiledMmaO64 = decltype(make_tiled_mma(
        GMMA::rs_op_selector<Element, Element, float, Shape<_64, HeadDim, BlockN>, GMMA::Major::K, GMMA::Major::MN>()));

    using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
    using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
    using PipelineState = typename PipelineKV::PipelineState;
    using PipelineStateQ = typename PipelineQ::PipelineState;

    struct SharedStorage {
        // 1024-byte alignment: the 128-byte swizzle pattern repeats every 1024 bytes.
        cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
        cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
        cute::array_aligned<Element, cosize_v<SmemLayoutVt>, 1024> v;
        typename PipelineQ::SharedStorage pipeline_q;
        typename PipelineKV::SharedStorage pipeline_k;
        typename PipelineKV::SharedStorage pipeline_v;
        std::conditional_t<kDynamicTiles, TileRing, NoTileRing> tile_ring;
        float2 softmax_fence[kNumConsumerThreads];  // wgmma_utils.h, wait_below
        // Ahead of the 1024-aligned O buffer, whose padding takes its byte in the other kernels (at d = 256
        // a member after that buffer would round the storage up by 1 KB, past the limit).
        std::conditional_t<kSplitBlocks, SplitRowStats, NoOBuffer> split_stats;
        std::conditional_t<kOBuffer, OBufferTurns, NoOBuffer> o_turns;
        std::conditional_t<kOBuffer, cute::array_aligned<Element, cosize_v<SmemLayoutO>, 1024>, NoOBuffer> o;
    };
    static constexpr int kSmemBytes = sizeof(SharedStorage);
    static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");

    // Global tensors as the TMA sees them: Q, K, O as (seqlen, head dim, heads, batch), V as
    // (head dim, seqlen, heads, batch). Varlen: seqlen is the packed total, batch is 1.
    using ShapeRows = Shape<int32_t, HeadDim, int32_t, int32_t>;
    using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
    using ShapeCols = Shape<HeadDim, int32_t, int32_t, int32_t>;
    using StrideCols = Stride<_1, int64_t, int64_t, int64_t>;

    template <class T, class Shape_, class Stride_>
    static auto gmem_tensor() {
        return make_tensor(make_gmem_ptr(static_cast<T *>(nullptr)), Shape_{}, Stride_{});
    }

    using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Element const, ShapeRows, StrideRows>(),
                                        SmemLayoutQ{}(_, _, _0{})));
    using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Element const, ShapeRows, StrideRows>(),
                                        SmemLayoutK{}(_, _, _0{})));
    using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, gmem_tensor<Element const, ShapeCols, StrideCols>(),
                                        SmemLayoutVt{}(_, _, _0{})));
    using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, gmem_tensor<Element, ShapeRows, StrideRows>(),
                                        SmemLayoutOBox{}));
};

}  // namespace flash::sm90
