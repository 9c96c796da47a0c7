#include "kvcache/prepare.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "common/dependent_launch.h"

namespace flash::kvcache {

namespace {

constexpr int kLayoutThreads = 256;
constexpr int kAppendThreads = 256;
constexpr int kMergeWarps = 4;
constexpr int kMergeBatch = 16;  // chunks whose loads a merge issues together

struct Maximum {
    __device__ int operator()(int a, int b) const { return max(a, b); }
};

__device__ int clamp_to(int64_t x, int64_t lo, int64_t hi) { return int(x < lo ? lo : x > hi ? hi : x); }

// The blocks after the first: the chunks' query rows, an element per thread and step.
__device__ void pack_query_rows(const LayoutParams &p) {
    const int64_t per_row = int64_t(p.nheads) * p.head_dim;
    const int64_t total = int64_t(p.batch) * p.splits * p.rows * per_row;
    const auto *q = static_cast<const uint16_t *>(p.q);
    auto *packed = static_cast<uint16_t *>(p.packed_q);
    for (int64_t i = (blockIdx.x - 1) * int64_t(blockDim.x) + threadIdx.x; i < total;
         i += (gridDim.x - 1) * int64_t(blockDim.x)) {
        const int64_t packed_row = i / per_row;
        const int head = int(i % per_row / p.head_dim), feature = int(i % p.head_dim);
        const int64_t b = packed_row / (int64_t(p.splits) * p.rows);
        const int r = int(packed_row % p.rows);
        packed[i] = q[b * p.q_strides.outer + r * p.q_strides.row + head * p.q_strides.head + feature];
    }
}

// Entry i of (cu_seqlens_q, cu_seqlens_k), the key offset before the running max: batch b's gap
// starts at its slot's row `first`, its chunk c ends c chunks later (at most at its last key).
__device__ int2 layout_entry(const LayoutParams &p, int i, int count) {
    if (i == 0) {
        return {0, 0};
    }
    if (i == count - 1) {
        return {p.batch * p.splits * p.rows, p.total_rows};
    }
    const int b = (i - 1) / (p.splits + 1), c = (i - 1) % (p.splits + 1);
    const int length = clamp_to(p.seqlens ? p.seqlens[b] : p.default_seqlen, 0, p.capacity - p.seqlen_new);
    int start = clamp_to(p.leftpad ? p.leftpad[b] : 0, 0, length);
    if (p.window_left >= 0) {
        start = max(start, length + p.seqlen_new - 1 - p.window_left);
    }
    const int keys = length + p.seqlen_new - start;
    int chunk = (keys + p.splits - 1) / p.splits;
    if (p.splits > 1) {
        chunk = (chunk + p.split_align - 1) / p.split_align * p.split_align;
    }
    const int64_t first = int64_t(b) * p.rows_per_slot + start;
    return {(b * p.splits + c) * p.rows, clamp_to(first + min(c * chunk, keys), 0, p.total_rows)};
}

// The first block: each thread computes its entries and the block makes the key offsets
// non-decreasing with a running max, kLayoutThreads entries at a time, in registers (the offsets
// of a decode step are one round trip to memory: its lengths). The forward's descriptors kernel
// may start meanwhile.
__global__ void __launch_bounds__(kLayoutThreads) layout_kernel(LayoutParams p) {
    flash::allow_next_grid();
    if (blockIdx.x > 0) {
        pack_query_rows(p);
        return;
    }
    const int count = p.batch * (p.splits + 1) + 2;
    using Scan = cub::BlockScan<int, kLayoutThreads>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ int carry;
    if (threadIdx.x == 0) {
        carry = 0;
    }
    for (int base = 0; base < count; base += kLayoutThreads) {
        const int i = base + threadIdx.x;
        const int2 entry = i < count ? layout_entry(p, i, count) : int2{0, 0};
        __syncthreads();  // carry written
        int key;
        Scan(scan_storage).InclusiveScan(max(entry.y, carry), key, Maximum{});
        if (i < count) {
            p.cu_seqlens_q[i] = entry.x;
            p.cu_seqlens_k[i] = key;
        }
        __syncthreads();
        if (threadIdx.x == kLayoutThreads - 1) {
            carry = key;
        }
    }
}

template <typename Element>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(AppendParams p) {
    const int pairs = p.head_dim / 2;
    const int64_t k_units = int64_t(p.batch) * p.seqlen_new * p.nheads_k * pairs;
    const int64_t q_units = p.q_out ? int64_t(p.batch) * p.seqlen_q * p.nheads * pairs : 0;
    const auto *cos = static_cast<const Element *>(p.cos);
    const auto *sin = static_cast<const Element *>(p.sin);
    for (int64_t unit = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; unit < k_units + q_units;
         unit += int64_t(gridDim.x) * blockDim.x) {
        const bool is_k = unit < k_units;
        const int64_t index = is_k ? unit : unit - k_units;
        const int pair = int(index % pairs);
        const int64_t row = index / pairs;
        const int nheads = is_k ? p.nheads_k : p.nheads;
        const int head = int(row % nheads);
        const int seqlen = is_k ? p.seqlen_new : p.seqlen_q;
        const int t = int(row / nheads % seqlen);
        const int b = int(row / nheads / seqlen);
        const int length = clamp_to(p.seqlens[b], 0, p.capacity - p.seqlen_new);
        const int position = length + (is_k || p.q_per_row ? t : 0);
        // The unit's two features, rotated together at angle `pair` where they are rotary ones.
        const bool rotated = p.cos && 2 * pair < p.rotary_dim;
        int f0 = 2 * pair, f1 = 2 * pair + 1;
        if (rotated && !p.interleaved) {
            f0 = pair;
            f1 = pair + p.rotary_dim / 2;
        }
        const RowStrides in = is_k ? p.k_strides : p.q_strides;
        const auto *src = static_cast<const Element *>(is_k ? p.k : p.q) + b * in.outer + t * in.row + head * in.head;
        float x0 = float(src[f0]), x1 = float(src[f1]);
        if (rotated) {
            const int at = min(position, p.seqlen_ro - 1);
            const float c = float(cos[int64_t(at) * (p.rotary_dim / 2) + pair]);
            const float s = float(sin[int64_t(at) * (p.rotary_dim / 2) + pair]);
            const float r0 = x0 * c - x1 * s;
            x1 = x0 * s + x1 * c;
            x0 = r0;
        }
        if (!is_k) {
            auto *dst = static_cast<Element *>(p.q_out) + b * p.q_out_strides.outer + t * p.q_out_strides.row +
                        head * p.q_out_strides.head;
            dst[f0] = Element(x0);
            dst[f1] = Element(x1);
            continue;
        }
        const int cache_row = clamp_to(int64_t(length) + t, 0, p.capacity - 1);
        int64_t outer = p.slots ? p.slots[b] : b;
        int inner = cache_row;
        if (p.page_size) {
            outer = p.block_table[b * p.block_table_stride + cache_row / p.page_size];
            inner = cache_row % p.page_size;
        }
        outer = outer < 0 ? 0 : outer >= p.cache_outer ? p.cache_outer - 1 : outer;
        auto *k_dst = static_cast<Element *>(p.k_cache) + outer * p.k_cache_strides.outer +
                      inner * p.k_cache_strides.row + head * p.k_cache_strides.head;
        k_dst[f0] = Element(x0);
        k_dst[f1] = Element(x1);
        const auto *v_src = static_cast<const Element *>(p.v) + b * p.v_strides.outer + t * p.v_strides.row +
                            head * p.v_strides.head;
        auto *v_dst = static_cast<Element *>(p.v_cache) + outer * p.v_cache_strides.outer +
                      inner * p.v_cache_strides.row + head * p.v_cache_strides.head;
        v_dst[2 * pair] = v_src[2 * pair];
        v_dst[2 * pair + 1] = v_src[2 * pair + 1];
    }
}

// A warp per merged row: lane s reads chunk s's logsumexp and the warp reduces them to the chunks'
// weights exp(lse_s - lse) (shuffles); each lane sums its features over the chunks in float32,
// rounded once. A decode step's merge was a chain of dependent loads (8-10 us for 8 chunks of 32
// rows, run 372; still 6 us for 12 chunks with a loop over the feature steps, run 388; 4.9 us with
// the chunks' loads batched by 8 after the weights, run 390): now the first kMergeBatch chunks'
// features are loaded together with the logsumexps, one round trip to memory for up to 16 chunks.
// kSteps: the features a lane sums, 32 apart (head_dim <= 32 kSteps).
template <typename Element, int kSteps>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(MergeParams p) {
    flash::wait_for_previous_grid();
    const int64_t row = blockIdx.x * int64_t(kMergeWarps) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= int64_t(p.batch) * p.rows * p.nheads) {
        return;
    }
    const int head = int(row % p.nheads);
    const int r = int(row / p.nheads % p.rows);
    const int b = int(row / p.nheads / p.rows);
    const int64_t lse_row = (int64_t(head) * p.batch + b) * p.splits * p.rows + r;
    const auto *__restrict__ out = static_cast<const Element *>(p.out) + head * p.out_head_stride;
    Element x[kMergeBatch][kSteps];
    const auto load_chunks = [&](int first) {
        #pragma unroll
        for (int c = 0; c < kMergeBatch; ++c) {
            const Element *chunk_row = out + ((int64_t(b) * p.splits + first + c) * p.rows + r) * p.out_row_stride;
            #pragma unroll
            for (int step = 0; step < kSteps; ++step) {
                const int f = lane + 32 * step;
                x[c][step] = first + c < p.splits && f < p.head_dim ? chunk_row[f] : Element(0.f);
            }
        }
    };
    // A chunk whose rows saw no key has lse +inf (and an output of zeros): weight 0.
    float l = lane < p.splits ? p.lse[lse_row + int64_t(lane) * p.rows] : INFINITY;
    if (p.alibi_slopes != nullptr && lane < p.splits) {
        const int *chunk_ends = p.cu_seqlens_k + 1 + int64_t(b) * (p.splits + 1) + 1;
        const float slope = p.alibi_slopes[b * p.alibi_batch_stride + head];
        l -= slope * float(chunk_ends[p.splits - 1] - chunk_ends[lane]);
    }
    load_chunks(0);
    float top = l == INFINITY ? -INFINITY : l;
    for (int offset = 16; offset > 0; offset /= 2) {
        top = fmaxf(top, __shfl_xor_sync(0xffffffff, top, offset));
    }
    const float e = l == INFINITY ? 0.f : expf(l - top);
    float total = e;
    for (int offset = 16; offset > 0; offset /= 2) {
        total += __shfl_xor_sync(0xffffffff, total, offset);
    }
    const bool empty = top == -INFINITY;
    const float weight = empty ? 0.f : e / total;
    auto *__restrict__ merged = static_cast<Element *>(p.merged) + b * p.merged_batch_stride +
                                r * p.merged_row_stride + head * p.merged_head_stride;
    float acc[kSteps] = {};
    for (int first = 0; first < p.splits; first += kMergeBatch) {
        if (first > 0) {
            load_chunks(first);
        }
        #pragma unroll
        for (int c = 0; c < kMergeBatch; ++c) {
            const float w = __shfl_sync(0xffffffff, weight, (first + c) % 32);
            #pragma unroll
            for (int step = 0; step < kSteps; ++step) {
                acc[step] += w * float(x[c][step]);
            }
        }
    }
    #pragma unroll
    for (int step = 0; step < kSteps; ++step) {
        if (lane + 32 * step < p.head_dim) {
            merged[lane + 32 * step] = Element(acc[step]);
        }
    }
    if (lane == 0) {
        p.merged_lse[(int64_t(head) * p.batch + b) * p.rows + r] = empty ? INFINITY : top + logf(total);
    }
}

}  // namespace

void launch_layout(const LayoutParams &p, cudaStream_t stream) {
    constexpr int64_t kMaxPackBlocks = 1024;
    const int64_t packed = p.q ? int64_t(p.batch) * p.splits * p.rows * p.nheads * p.head_dim : 0;
    const int64_t pack_blocks = std::min((packed + kLayoutThreads - 1) / kLayoutThreads, kMaxPackBlocks);
    layout_kernel<<<int(1 + pack_blocks), kLayoutThreads, 0, stream>>>(p);
}

template <typename Element>
void launch_append(const AppendParams &p, cudaStream_t stream) {
    const int64_t units = int64_t(p.batch) * (p.seqlen_new * p.nheads_k + (p.q_out ? p.seqlen_q * p.nheads : 0)) *
                          (p.head_dim / 2);
    const int64_t blocks = (units + kAppendThreads - 1) / kAppendThreads;
    if (blocks > 0) {
        append_kernel<Element><<<int(blocks < 65536 ? blocks : 65536), kAppendThreads, 0, stream>>>(p);
    }
}

// Launched dependent on the forward before it, which lets it start at the forward's start.
template <typename Element>
void launch_merge(const MergeParams &p, cudaStream_t stream) {
    const int64_t rows = int64_t(p.batch) * p.rows * p.nheads;
    if (rows <= 0) {
        return;
    }
    const dim3 grid(unsigned((rows + kMergeWarps - 1) / kMergeWarps)), block(kMergeWarps * 32);
    const auto kernel = p.head_dim <= 64    ? merge_kernel<Element, 2>
                        : p.head_dim <= 128 ? merge_kernel<Element, 4>
                                            : merge_kernel<Element, kMaxMergeHeadDim / 32>;
    flash::launch_dependent(kernel, grid, block, 0, stream, p);
}

template void launch_append<__half>(const AppendParams &, cudaStream_t);
template void launch_append<__nv_bfloat16>(const AppendParams &, cudaStream_t);
template void launch_merge<__half>(const MergeParams &, cudaStream_t);
template void launch_merge<__nv_bfloat16>(const MergeParams &, cudaStream_t);

}  // namespace flash::kvcache
