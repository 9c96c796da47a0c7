// Tile shapes, shared-memory layouts, TiledMMAs and copy atoms for the sm80 (mma.sync) kernels.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

// What the forward and backward kernels share: the MMA atom, the swizzled shared-memory tiles and
// the copy atoms between global memory, shared memory and registers.
template <int kHeadDim_, int kNThreads_, typename Element_>
struct KernelTraitsBase {
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kNThreads = kNThreads_;
    static_assert(kHeadDim % 32 == 0);

    using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     cute::SM80_16x8x16_F32F16F16F32_TN,
                                     cute::SM80_16x8x16_F32BF16BF16F32_TN>;
    // kAtomM x kAtomN warps, each owning whole 16x16 pieces of the tile (so that one ldmatrix.x4
    // feeds two MMAs along N).
    template <int kAtomM, int kAtomN>
    using WarpTiledMma = decltype(cute::make_tiled_mma(
        MmaOp{}, cute::Layout<cute::Shape<cute::Int<kAtomM>, cute::Int<kAtomN>, cute::_1>>{},
        cute::Tile<cute::Int<16 * kAtomM>, cute::Int<16 * kAtomN>, cute::_16>{}));

    // A (rows x cols) tile in shared memory, built from 8-row atoms of 64 (or 32) columns,
    // XOR-swizzled on 16-byte chunks so that ldmatrix reads of 8 rows at one column hit different
    // banks.
    template <int kCols>
    using SmemLayoutAtom = decltype(cute::composition(
        cute::Swizzle<kCols % 64 == 0 ? 3 : 2, 3, 3>{},
        cute::Layout<cute::Shape<cute::_8, cute::Int<kCols % 64 == 0 ? 64 : 32>>,
                     cute::Stride<cute::Int<kCols % 64 == 0 ? 64 : 32>, cute::_1>>{}));
    template <int kRows, int kCols>
    using SmemTile = decltype(cute::tile_to_shape(SmemLayoutAtom<kCols>{},
                                                  cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}));
    // The (cols x rows) transpose of a (rows x cols) tile: the same memory, for an operand the
    // GEMM reads along the other dimension.
    template <class Tile>
    using SmemTileTransposed = decltype(cute::composition(
        Tile{}, cute::make_layout(cute::Shape<decltype(cute::size<1>(Tile{})), decltype(cute::size<0>(Tile{}))>{},
                                  cute::GenRowMajor{})));

    // Global <-> shared: 16-byte accesses, kGmemThreadsPerRow threads cover 64 (or 32) columns.
    static constexpr int kGmemElemsPerAccess = 16 / sizeof(Element);
    static constexpr int kGmemThreadsPerRow = (kHeadDim % 64 == 0 ? 64 : 32) / kGmemElemsPerAccess;
    static_assert(kNThreads % kGmemThreadsPerRow == 0);
    using GmemThreadLayout =
        cute::Layout<cute::Shape<cute::Int<kNThreads / kGmemThreadsPerRow>, cute::Int<kGmemThreadsPerRow>>,
                     cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
    using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerAccess>>>;
    // cp.async with zero-fill: rows past the sequence end read as 0.
    using GmemTiledCopyIn = decltype(cute::make_tiled_copy(
        cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{},
        GmemThreadLayout{}, GmemValLayout{}));
    using GmemTiledCopyOut = decltype(cute::make_tiled_copy(
        cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>{},
        GmemThreadLayout{}, GmemValLayout{}));

    // Shared -> registers for MMA operands, as stored (K-major) or transposed (MN-major).
    using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
    using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
    // Accumulator registers -> shared: each thread holds pairs of adjacent columns.
    using SmemCopyAtomAcc = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct FwdKernelTraits : KernelTraitsBase<kHeadDim_, kNWarps_ * 32, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kNWarps_ * 32, Element_>;
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kNWarps = kNWarps_;
    static_assert(kBlockN % 16 == 0);
    static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row MMA tiles of Q");

    // Warps are stacked along M (rows of Q): each warp computes whole rows of S and of O, so the
    // softmax never needs another warp's data (paper section 3.3, "splitting Q"). N is one 16-wide
    // piece per step.
    using TiledMma = typename Base::template WarpTiledMma<kNWarps, 1>;

    using SmemLayoutQ = typename Base::template SmemTile<kBlockM, kHeadDim>;
    using SmemLayoutKV = typename Base::template SmemTile<kBlockN, kHeadDim>;
    // V seen as V^T (head_dim x kBlockN), the B operand of P V.
    using SmemLayoutVt = typename Base::template SmemTileTransposed<SmemLayoutKV>;
    // O is staged through Q's shared memory, which is dead once the last S = Q K^T is done.
    using SmemLayoutO = SmemLayoutQ;

    static constexpr int kSmemQSize = cute::cosize_v<SmemLayoutQ> * sizeof(Element);
    static constexpr int kSmemKVSize = cute::cosize_v<SmemLayoutKV> * sizeof(Element);
    static constexpr int kSmemSize = kSmemQSize + 2 * kSmemKVSize;
};

// Backward (Algorithm 2): one thread block owns kBlockN rows of K and V and visits the Q blocks
// kBlockM rows at a time. Five GEMMs, each with its own warp layout:
//   S = Q K^T, dP = dO V^T   (kBlockM x kBlockN), kAtomMSdP warps along M
//   dV += P^T dO, dK += dS^T Q (kBlockN x kHeadDim), kAtomMdKV warps along M
//   dQ = dS K                 (kBlockM x kHeadDim), kAtomMdQ warps along M
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomMSdP, int kAtomMdKV, int kAtomMdQ,
          int kStagesQdO_, bool kDqBeforeDk_, typename Element_>
struct BwdKernelTraits : KernelTraitsBase<kHeadDim_, kNWarps_ * 32, Element_> {
    using Base = KernelTraitsBase<kHeadDim_, kNWarps_ * 32, Element_>;
    using Element = Element_;
    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kNWarps = kNWarps_;
    // Shared-memory buffers for Q and dO: 2 overlaps the load of the next Q/dO block with compute.
    static constexpr int kStagesQdO = kStagesQdO_;
    static_assert(kStagesQdO == 1 || kStagesQdO == 2);
    // Where dQ = dS K and its adds go in the inner loop: between the dV and dK GEMMs, or last.
    static constexpr bool kDqBeforeDk = kDqBeforeDk_;
    static_assert(kBlockN % 32 == 0 && kNWarps % kAtomMSdP == 0 && kNWarps % kAtomMdKV == 0 &&
                  kNWarps % kAtomMdQ == 0);
    static_assert(kBlockM % (16 * kAtomMSdP) == 0 && kBlockN % (16 * (kNWarps / kAtomMSdP)) == 0);
    static_assert(kBlockN % (16 * kAtomMdKV) == 0 && kHeadDim % (16 * (kNWarps / kAtomMdKV)) == 0);
    static_assert(kBlockM % (16 * kAtomMdQ) == 0 && kHeadDim % (16 * (kNWarps / kAtomMdQ)) == 0);

    using TiledMmaSdP = typename Base::template WarpTiledMma<kAtomMSdP, kNWarps / kAtomMSdP>;
    using TiledMmadKV = typename Base::template WarpTiledMma<kAtomMdKV, kNWarps / kAtomMdKV>;
    using TiledMmadQ = typename Base::template WarpTiledMma<kAtomMdQ, kNWarps / kAtomMdQ>;

    using SmemLayoutQdO = typename Base::template SmemTile<kBlockM, kHeadDim>;
    using SmemLayoutQdOt = typename Base::template SmemTileTransposed<SmemLayoutQdO>;
    using SmemLayoutKV = typename Base::template SmemTile<kBlockN, kHeadDim>;
    using SmemLayoutKt = typename Base::template SmemTileTransposed<SmemLayoutKV>;
    using SmemLayoutPdS = typename Base::template SmemTile<kBlockM, kBlockN>;
    using SmemLayoutPdSt = typename Base::template SmemTileTransposed<SmemLayoutPdS>;

    static constexpr int kSmemQdOElems = cute::cosize_v<SmemLayoutQdO>;
    static constexpr int kSmemKVElems = cute::cosize_v<SmemLayoutKV>;
    static constexpr int kSmemPdSElems = cute::cosize_v<SmemLayoutPdS>;
    // K, V, kStagesQdO x (Q, dO), P, dS.
    static constexpr int kSmemSize =
        (2 * kSmemKVElems + 2 * kStagesQdO * kSmemQdOElems + 2 * kSmemPdSElems) * sizeof(Element);
};
