// Build: nvcc -std=c++17 --expt-relaxed-constexpr -I csrc -I <cutlass include> benchmarks/sm90/check_o_stsm_host.cu
// Host simulation of the forward epilogue's O store by stmatrix (x4, not transposed): every O element
// must land once, at the offset the old element-wise store (copy into partition_C) wrote it.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cute/tensor.hpp>
#include "sm90/fwd_kernel_traits.h"
using namespace cute;

template <class TiledMma, class TileShape, class Layout>
int simulate(const char *name, int threads, TileShape tile, Layout smem_layout) {
    using Element = cutlass::bfloat16_t;
    TiledMma mma;
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    Element *base = (Element *)aligned_alloc(1024, cosize(smem_layout) * sizeof(Element) + 1024);
    Tensor sO = make_tensor(make_smem_ptr(base), smem_layout);  // (rows, cols)
    std::vector<int> hits(cosize(smem_layout), 0);
    int errors = 0;
    long checked = 0;
    for (int t = 0; t < threads; ++t) {
        auto thr_mma = mma.get_thread_slice(t);
        Tensor cO = thr_mma.partition_C(make_identity_tensor(tile));
        Tensor acc = partition_fragment_C(mma, tile);
        Tensor idx = make_tensor<int>(acc.layout());
        for (int i = 0; i < size(idx); ++i) idx(i) = i;
        auto thr = r2s.get_thread_slice(t);
        Tensor src = thr.retile_S(idx);
        if (t == 0) { print(src.layout()); printf("  "); print(thr.partition_D(sO).layout()); printf("\n"); }
        const int lane = t % 32, warp = t / 32;
        for (int m = 0; m < size<1>(src); ++m)
            for (int n = 0; n < size<2>(src); ++n)
                for (int j = 0; j < size<0, 1>(src); ++j)
                    for (int r = 0; r < 4; ++r)
                        for (int h = 0; h < 2; ++h) {
                            const int i = src(make_coord(2 * r + h, j), m, n);
                            const int row = get<0>(cO(i)), col = get<1>(cO(i));
                            const int tp = 32 * warp + 8 * r + lane / 4;  // the lane giving this row's address
                            Tensor dstp = r2s.get_thread_slice(tp).partition_D(sO);
                            const long o0 = raw_pointer_cast(&dstp(make_coord(0, j), m, n)) - base;
                            for (int v = 0; v < 8; ++v) {
                                if (raw_pointer_cast(&dstp(make_coord(v, j), m, n)) - base != o0 + v) ++errors;
                            }
                            const long addr = o0 + 2 * (lane % 4) + h;
                            const long want = raw_pointer_cast(&sO(row, col)) - base;
                            ++checked;
                            if (addr != want && errors++ < 5) printf("mismatch t=%d row=%d col=%d\n", t, row, col);
                            if (want >= 0 && want < (long)hits.size()) hits[want]++;
                        }
    }
    int bad = 0;
    for (int x : hits) bad += x != 1;
    printf("%s: checked %ld, errors %d, elements not written once %d of %zu\n", name, checked, errors, bad, hits.size());
    return errors + bad;
}

template <int D, int BM, int BN>
int check_config() {
    using T = flash::sm90::FwdKernelTraits<cutlass::bfloat16_t, D, BM, BN, 2, false>;
    char name[64];
    if constexpr (T::kOBuffer) {
        snprintf(name, sizeof name, "d=%d kOBuffer", D);
        return simulate<typename T::TiledMmaO64>(name, 128, Shape<_64, Int<D>>{}, typename T::SmemLayoutO{});
    } else {
        snprintf(name, sizeof name, "d=%d BlockM=%d", D, BM);
        auto stage0 = typename T::SmemLayoutQ{}(_, _, 0);
        return simulate<typename T::TiledMmaO>(name, T::kNumConsumerThreads, Shape<Int<BM>, Int<D>>{}, stage0.layout());
    }
}

int main() {
    int e = check_config<64, 192, 128>() + check_config<64, 128, 128>() + check_config<96, 128, 128>() +
            check_config<128, 128, 128>() + check_config<192, 128, 96>() + check_config<256, 128, 64>();
    return e != 0;
}
