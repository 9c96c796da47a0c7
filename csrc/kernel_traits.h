// Tile shapes, shared-memory layouts, TiledMMA and copy atoms for the sm80 (mma.sync) forward.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Element_>
struct FwdKernelTraits {
    using Element = Element_;
    using ElementAccum = float;

    static constexpr int kHeadDim = kHeadDim_;
    static constexpr int kBlockM = kBlockM_;
    static constexpr int kBlockN = kBlockN_;
    static constexpr int kNWarps = kNWarps_;
    static constexpr int kNThreads = kNWarps * 32;
    static_assert(kHeadDim % 32 == 0 && kBlockN % 16 == 0);
    static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row MMA tiles of Q");

    using MmaOp = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     cute::SM80_16x8x16_F32F16F16F32_TN,
                                     cute::SM80_16x8x16_F32BF16BF16F32_TN>;
    // Warps are stacked along M (rows of Q): each warp computes whole rows of S and of O, so the
    // softmax never needs another warp's data (paper section 3.3, "splitting Q").
    using TiledMma = decltype(cute::make_tiled_mma(
        MmaOp{}, cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>{},
        cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>{}));

    // Shared memory is tiled in 8-row atoms of 64 (or 32) columns, XOR-swizzled on 16-byte chunks
    // so that ldmatrix reads of 8 rows at one column hit different banks.
    static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
    static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;
    using SmemLayoutAtom = decltype(cute::composition(
        cute::Swizzle<kSwizzleBits, 3, 3>{},
        cute::Layout<cute::Shape<cute::_8, cute::Int<kBlockKSmem>>,
                     cute::Stride<cute::Int<kBlockKSmem>, cute::_1>>{}));
    using SmemLayoutQ = decltype(cute::tile_to_shape(
        SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
    using SmemLayoutKV = decltype(cute::tile_to_shape(
        SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
    // V seen as V^T (head_dim x kBlockN), the B operand of P V.
    using SmemLayoutVt = decltype(cute::composition(
        SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                          cute::GenRowMajor{})));
    // O is staged through Q's shared memory, which is dead once the last S = Q K^T is done.
    using SmemLayoutO = SmemLayoutQ;

    static constexpr int kSmemQSize = cute::cosize_v<SmemLayoutQ> * sizeof(Element);
    static constexpr int kSmemKVSize = cute::cosize_v<SmemLayoutKV> * sizeof(Element);
    static constexpr int kSmemSize = kSmemQSize + 2 * kSmemKVSize;

    // Global <-> shared: 16-byte accesses, kGmemThreadsPerRow threads cover kBlockKSmem columns.
    static constexpr int kGmemElemsPerAccess = 16 / sizeof(Element);
    static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerAccess;
    static_assert(kNThreads % kGmemThreadsPerRow == 0);
    using GmemThreadLayout =
        cute::Layout<cute::Shape<cute::Int<kNThreads / kGmemThreadsPerRow>, cute::Int<kGmemThreadsPerRow>>,
                     cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
    using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerAccess>>>;
    // cp.async with zero-fill: rows past the sequence end and columns past head_dim read as 0.
    using GmemTiledCopyQKV = decltype(cute::make_tiled_copy(
        cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{},
        GmemThreadLayout{}, GmemValLayout{}));
    using GmemTiledCopyO = decltype(cute::make_tiled_copy(
        cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>{},
        GmemThreadLayout{}, GmemValLayout{}));

    // Shared -> registers for the MMA operands; V is read transposed.
    using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
    using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
    // Registers -> shared for O: each thread holds pairs of adjacent columns.
    using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;
};
