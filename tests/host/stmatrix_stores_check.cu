// Host simulation of the Hopper kernels' stores by stmatrix (x4, not transposed), built by
// tests/test_host_checks.py. Lane l of a warp gives the address of one 16-byte row of an 8 x 8 tile
// (row l % 8 of tile l / 8) and holds elements 2 (l % 4) and 2 (l % 4) + 1 of row l / 4 of each of
// its four tiles. Every accumulator entry must land once, where an element-wise store by its
// coordinates would have put it:
// - the forward's O into its tile's Q buffer or its O buffer (csrc/sm90/fwd_epilogue.h), every
//   tile config;
// - the backward's dS^T into its MN-major buffers (csrc/sm90/bwd_consumer.h); at d = 256 both
//   warpgroups hold the same S^T and each copies two of the copy's four 16-query chunks.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cute/tensor.hpp>

#include "sm90/bwd_kernel_traits.h"
#include "sm90/fwd_kernel_traits.h"

using namespace cute;

static int failures = 0;

// threads simulated; thread t is thread t % slice_threads of the MMA and copies value chunk j of its
// copy where copies(t, j). view(base): the buffers as an (accumulator row, accumulator col, buffer)
// tensor of `elements` elements from base.
template <class Element, class TiledMma, class Tile, class View, class Copies>
void simulate(const char *name, int threads, int slice_threads, Tile tile, size_t elements, View view, Copies copies) {
    TiledMma mma;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    Element *base = static_cast<Element *>(aligned_alloc(1024, (elements * sizeof(Element) + 1023) / 1024 * 1024));
    Tensor smem = view(base);
    const auto offset = [&](auto const &element) { return long(raw_pointer_cast(&element) - base); };
    std::vector<int> hits(elements, 0);
    long checked = 0, wrong = 0;
    for (int b = 0; b < size<2>(smem); ++b) {
        for (int t = 0; t < threads; ++t) {
            const int slice = t % slice_threads, lane = slice % 32, warp = slice / 32;
            Tensor coord = mma.get_thread_slice(slice).partition_C(make_identity_tensor(tile));
            Tensor index = make_tensor<int>(partition_fragment_C(mma, tile).layout());
            for (int i = 0; i < size(index); ++i) {
                index(i) = i;
            }
            Tensor src = r2s.get_thread_slice(slice).retile_S(index);
            for (int m = 0; m < size<1>(src); ++m) {
                for (int n = 0; n < size<2>(src); ++n) {
                    for (int j = 0; j < size<0, 1>(src); ++j) {
                        if (!copies(t, j)) {
                            continue;
                        }
                        for (int r = 0; r < 4; ++r) {
                            // The row addresses of this thread's tile r come from lane 8 r + lane / 4.
                            Tensor dst = r2s.get_thread_slice(32 * warp + 8 * r + lane / 4).partition_D(smem);
                            const long row_start = offset(dst(make_coord(0, j), m, n, b));
                            for (int v = 1; v < 8; ++v) {
                                wrong += offset(dst(make_coord(v, j), m, n, b)) != row_start + v;
                            }
                            for (int h = 0; h < 2; ++h) {
                                const int i = src(make_coord(2 * r + h, j), m, n);
                                const long want = offset(smem(get<0>(coord(i)), get<1>(coord(i)), b));
                                ++checked;
                                if (row_start + 2 * (lane % 4) + h != want || want < 0 || size_t(want) >= elements) {
                                    ++wrong;
                                } else {
                                    hits[size_t(want)]++;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    long not_once = 0;
    for (int x : hits) {
        not_once += x != 1;
    }
    failures += wrong != 0 || not_once != 0 || checked == 0;
    printf("%s: %ld entries, %ld misplaced, %ld of %zu elements not written once\n", name, checked, wrong, not_once,
           elements);
    free(base);
}

template <int D, int BM, int BN>
void forward_o() {
    using Element = cutlass::bfloat16_t;
    using T = flash::sm90::FwdKernelTraits<Element, D, BM, BN, 2, false>;
    const auto all = [](int, int) { return true; };
    char name[64];
    if constexpr (T::kOBuffer) {
        snprintf(name, sizeof name, "forward O, d=%d, O buffer", D);
        const auto view = [](Element *base) {
            Tensor o = make_tensor(make_smem_ptr(base), typename T::SmemLayoutO{});
            return make_tensor(o.data(), append(o.layout(), Layout<_1, _0>{}));
        };
        simulate<Element, typename T::TiledMmaO64>(name, 128, 128, Shape<_64, Int<D>>{},
                                                   cosize_v<typename T::SmemLayoutO>, view, all);
    } else {
        snprintf(name, sizeof name, "forward O, d=%d, %d-row tiles", D, BM);
        const auto view = [](Element *base) { return make_tensor(make_smem_ptr(base), typename T::SmemLayoutQ{}); };
        simulate<Element, typename T::TiledMmaO>(name, T::kNumConsumerThreads, T::kNumConsumerThreads,
                                                 Shape<Int<BM>, Int<D>>{}, cosize_v<typename T::SmemLayoutQ>, view,
                                                 all);
    }
}

template <class Element, int D>
void backward_ds() {
    using T = flash::sm90::BwdKernelTraits<Element, D>;
    const int threads = T::kSplitHeadDim ? 2 * T::kScoreThreads : T::kScoreThreads;
    // Warpgroup t / 128 copies chunks {0, 1} or {2, 3} where both hold S^T.
    const auto chunks = [](int t, int j) { return !T::kSplitHeadDim || j / 2 == t / 128; };
    char name[64];
    snprintf(name, sizeof name, "backward dS^T, d=%d, %s", D,
             std::is_same_v<Element, cutlass::half_t> ? "fp16" : "bf16");
    // The (query, key, buffer) buffers seen as (key, query, buffer), as the consumer copies them.
    const auto view = [](Element *base) {
        Tensor ds = make_tensor(make_smem_ptr(base), typename T::SmemLayoutDs{});
        return make_tensor(ds.data(), select<1, 0, 2>(ds.layout()));
    };
    simulate<Element, typename T::TiledMmaSdP>(name, threads, T::kScoreThreads,
                                               Shape<typename T::BlockN, typename T::BlockM>{},
                                               cosize_v<typename T::SmemLayoutDs>, view, chunks);
}

int main() {
    forward_o<64, 192, 128>();
    forward_o<64, 128, 128>();
    forward_o<96, 128, 128>();
    forward_o<128, 128, 128>();
    forward_o<192, 128, 96>();
    forward_o<256, 128, 64>();
    backward_ds<cutlass::bfloat16_t, 64>();
    backward_ds<cutlass::bfloat16_t, 128>();
    backward_ds<cutlass::bfloat16_t, 256>();
    backward_ds<cutlass::half_t, 256>();
    printf("%d failures\n", failures);
    return failures != 0;
}
