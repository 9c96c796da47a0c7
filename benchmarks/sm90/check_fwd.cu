// Standalone check and timing of the Hopper forward (csrc/sm90), without torch.
//
//   check_fwd check [quick|all [d]]  every case (or a few: quick) against an fp32 reference
//                                    computed on the GPU; d: that head dim alone
//   check_fwd bench [seqlen [rows]]  TFLOPs/s on the paper's grid (bf16, hidden 2048, 16k tokens);
//                                    seqlen: that column alone (for ncu); rows: that many query
//                                    rows per sequence against seqlen keys (non-causal only);
//                                    BENCH_WINDOW=left,right: with that window (the causal rows
//                                    take its left side), times alone being comparable
//
// Head dims and dtypes: those built in (-DWITH_HDIM_<d>, -DWITH_DTYPE_BF16 / _FP16; one object per
// instance, see run.sh).
//
// Pass rule: O is poisoned with NaN before each call; a case passes when no output is NaN,
// max|O - O_ref| <= tol * max|O_ref| (tol 2e-2 for bf16, 4e-3 for fp16: a few roundings of the
// 16-bit P and O), and |lse - lse_ref| <= 1e-3 * max(1, |lse_ref|) with +inf where a row sees no
// key. The 64 KB past the end of O and of lse must stay poisoned. The forward's workspace is
// poisoned too: the launcher must initialize it (the causal kernels' tile counter).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include "common/flash.h"
#include "sm90/workspace.h"

template <typename Element, int kHeadDim, bool kIsCausal>
void run_mha_fwd_sm90(Flash_fwd_params &params, cudaStream_t stream);

#define CUDA_CHECK(expr)                                                                                 \
    do {                                                                                                 \
        cudaError_t err_ = (expr);                                                                       \
        if (err_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
            std::exit(2);                                                                                \
        }                                                                                                \
    } while (0)

enum class Dtype { kBf16, kFp16 };

static const std::vector<int> &built_head_dims() {
    static const std::vector<int> dims = {
#ifdef WITH_HDIM_64
        64,
#endif
#ifdef WITH_HDIM_96
        96,
#endif
#ifdef WITH_HDIM_128
        128,
#endif
#ifdef WITH_HDIM_192
        192,
#endif
#ifdef WITH_HDIM_256
        256,
#endif
    };
    return dims;
}

template <typename Element, bool kIsCausal>
static void run_fwd_for(int head_dim, Flash_fwd_params &params, cudaStream_t stream) {
    switch (head_dim) {
#ifdef WITH_HDIM_64
        case 64: run_mha_fwd_sm90<Element, 64, kIsCausal>(params, stream); return;
#endif
#ifdef WITH_HDIM_96
        case 96: run_mha_fwd_sm90<Element, 96, kIsCausal>(params, stream); return;
#endif
#ifdef WITH_HDIM_128
        case 128: run_mha_fwd_sm90<Element, 128, kIsCausal>(params, stream); return;
#endif
#ifdef WITH_HDIM_192
        case 192: run_mha_fwd_sm90<Element, 192, kIsCausal>(params, stream); return;
#endif
#ifdef WITH_HDIM_256
        case 256: run_mha_fwd_sm90<Element, 256, kIsCausal>(params, stream); return;
#endif
        default: std::fprintf(stderr, "head dim %d not built\n", head_dim); std::exit(2);
    }
}

static const std::vector<Dtype> &built_dtypes() {
    static const std::vector<Dtype> dtypes = {
#ifdef WITH_DTYPE_BF16
        Dtype::kBf16,
#endif
#ifdef WITH_DTYPE_FP16
        Dtype::kFp16,
#endif
    };
    return dtypes;
}

static void run_fwd(Dtype dtype, bool causal, int head_dim, Flash_fwd_params &params, cudaStream_t stream) {
#ifdef WITH_DTYPE_BF16
    if (dtype == Dtype::kBf16) {
        causal ? run_fwd_for<cutlass::bfloat16_t, true>(head_dim, params, stream)
               : run_fwd_for<cutlass::bfloat16_t, false>(head_dim, params, stream);
        return;
    }
#endif
#ifdef WITH_DTYPE_FP16
    if (dtype == Dtype::kFp16) {
        causal ? run_fwd_for<cutlass::half_t, true>(head_dim, params, stream)
               : run_fwd_for<cutlass::half_t, false>(head_dim, params, stream);
        return;
    }
#endif
    std::fprintf(stderr, "dtype not built\n");
    std::exit(2);
}

// ---------------------------------------------------------------------------------------------
// Device helpers: random normal inputs, 16-bit <-> float, the reference, the comparison.

__device__ float to_float(uint16_t x, bool bf16) {
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}

__device__ uint16_t from_float(float x, bool bf16) {
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16(x)) : __half_as_ushort(__float2half(x));
}

__device__ uint32_t hash32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return uint32_t(x);
}

// Standard normal values (Box-Muller on a counter hash), one per element.
__global__ void fill_normal(uint16_t *x, int64_t n, uint64_t seed, bool bf16) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float u1 = (hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i) + 1.f) * 2.3283064e-10f;
        const float u2 = hash32(seed * 0x9e3779b97f4a7c15ull + 2 * i + 1) * 2.3283064e-10f;
        x[i] = from_float(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2), bf16);
    }
}

// One sequence of the batch: its first row in the q-like and k-like tensors, and its lengths.
struct SeqDesc {
    int q_start, k_start, seqlen_q, seqlen_k;
};

struct RefArgs {
    const uint16_t *q, *k, *v;
    int64_t q_row, k_row, v_row, q_head, k_head, v_head;  // element strides (rows packed per sequence)
    const SeqDesc *seqs;
    int heads, heads_k, head_dim, max_seqlen_k;
    int window_left, window_right;  // kWindowUnbounded: no bound
    float scale;
    bool causal, bf16, varlen;
    int total_q, seqlen_q_padded;  // lse layout: varlen (heads, total_q), else (batch, heads, seqlen_q)
    float *o_ref;                  // (total_q, heads, head_dim)
    float *lse_ref;
};

// One block per (query row, head, sequence): scores in shared memory, fp32 throughout.
__global__ void reference_attention(RefArgs a) {
    extern __shared__ float smem[];
    const SeqDesc s = a.seqs[blockIdx.z];
    const int i = blockIdx.x, h = blockIdx.y;
    if (i >= s.seqlen_q) {
        return;
    }
    const int hk = h / (a.heads / a.heads_k);
    float *scores = smem;
    float *qrow = smem + a.max_seqlen_k;
    float *red = qrow + a.head_dim;
    const uint16_t *q = a.q + (s.q_start + i) * a.q_row + h * a.q_head;
    for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) {
        qrow[c] = to_float(q[c], a.bf16);
    }
    __syncthreads();
    // Row i sees keys j with -left <= j - (i + seqlen_k - seqlen_q) <= right (causal: right = 0).
    const int diag = i + s.seqlen_k - s.seqlen_q;
    const int right = a.causal ? 0 : a.window_right;
    const int last = right == kWindowUnbounded ? s.seqlen_k - 1 : min(s.seqlen_k - 1, diag + right);
    const int first = a.window_left == kWindowUnbounded ? 0 : max(0, diag - a.window_left);
    float m = -INFINITY;
    for (int j = first + threadIdx.x; j <= last; j += blockDim.x) {
        const uint16_t *k = a.k + (s.k_start + j) * a.k_row + hk * a.k_head;
        float dot = 0.f;
        for (int c = 0; c < a.head_dim; ++c) {
            dot += qrow[c] * to_float(k[c], a.bf16);
        }
        scores[j] = dot * a.scale;
        m = fmaxf(m, scores[j]);
    }
    auto block_reduce = [&](float x, bool is_max) {
        for (int o = 16; o > 0; o /= 2) {
            const float y = __shfl_xor_sync(0xffffffff, x, o);
            x = is_max ? fmaxf(x, y) : x + y;
        }
        __syncthreads();
        if (threadIdx.x % 32 == 0) {
            red[threadIdx.x / 32] = x;
        }
        __syncthreads();
        float r = is_max ? -INFINITY : 0.f;
        for (int w = 0; w < blockDim.x / 32; ++w) {
            r = is_max ? fmaxf(r, red[w]) : r + red[w];
        }
        return r;
    };
    m = block_reduce(m, true);
    float sum = 0.f;
    for (int j = first + threadIdx.x; j <= last; j += blockDim.x) {
        scores[j] = expf(scores[j] - m);
        sum += scores[j];
    }
    sum = block_reduce(sum, false);
    const bool empty = last < first;
    float *o = a.o_ref + (int64_t(s.q_start + i) * a.heads + h) * a.head_dim;
    for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) {
        float acc = 0.f;
        for (int j = first; j <= last; ++j) {
            acc += scores[j] * to_float(a.v[(s.k_start + j) * a.v_row + hk * a.v_head + c], a.bf16);
        }
        o[c] = empty ? 0.f : acc / sum;
    }
    if (threadIdx.x == 0) {
        const int64_t row = a.varlen ? int64_t(h) * a.total_q + s.q_start + i
                                     : (int64_t(blockIdx.z) * a.heads + h) * a.seqlen_q_padded + i;
        a.lse_ref[row] = empty ? INFINITY : m + logf(sum);
    }
}

struct CompareResult {
    float max_err, max_ref, max_lse_err;
    unsigned int nan_count, lse_bad, guard_bad;
};

__device__ void atomic_max_nonneg(float *addr, float x) {
    atomicMax(reinterpret_cast<int *>(addr), __float_as_int(x));
}

// O of every sequence's rows against the reference; NaN anywhere counts as a failure.
__global__ void compare_o(const uint16_t *o, int64_t o_row, int64_t o_head, const float *o_ref, int total_q,
                          int heads, int head_dim, bool bf16, CompareResult *r) {
    const int64_t n = int64_t(total_q) * heads * head_dim;
    for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
         idx += int64_t(gridDim.x) * blockDim.x) {
        const int c = idx % head_dim;
        const int h = (idx / head_dim) % heads;
        const int64_t row = idx / (int64_t(head_dim) * heads);
        const float x = to_float(o[row * o_row + h * o_head + c], bf16);
        const float ref = o_ref[idx];
        if (!(x == x)) {
            atomicAdd(&r->nan_count, 1u);
        } else {
            atomic_max_nonneg(&r->max_err, fabsf(x - ref));
        }
        atomic_max_nonneg(&r->max_ref, fabsf(ref));
    }
}

__global__ void compare_lse(const float *lse, const float *lse_ref, int64_t n, CompareResult *r) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float x = lse[i], ref = lse_ref[i];
        const bool ok = isinf(ref) ? x == ref : fabsf(x - ref) <= 1e-3f * fmaxf(1.f, fabsf(ref));
        if (!ok) {
            atomicAdd(&r->lse_bad, 1u);
        }
        if (isfinite(ref) && x == x) {
            atomic_max_nonneg(&r->max_lse_err, fabsf(x - ref));
        }
    }
}

// Bytes past the outputs' last element must still hold the poison (0xff).
__global__ void check_guard(const uint8_t *p, int64_t n, CompareResult *r) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        if (p[i] != 0xff) {
            atomicAdd(&r->guard_bad, 1u);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host side.

static int blocks_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 4096)); }

struct Case {
    std::string name;
    int head_dim, heads, heads_k;
    bool causal;
    Dtype dtype;
    std::vector<int> seqlens_q, seqlens_k;  // per sequence
    bool varlen;
    int row_pad;  // extra elements per row of K, V and O (strided, not packed, rows)
    int window_left = kWindowUnbounded, window_right = kWindowUnbounded;
};

struct Buffers {
    uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    float *lse = nullptr;
    int64_t o_bytes = 0, lse_bytes = 0;
};

static constexpr int64_t kGuardBytes = 1 << 16;

static bool run_case(const Case &cs, cudaStream_t stream, uint64_t seed) {
    const bool bf16 = cs.dtype == Dtype::kBf16;
    const int batch = int(cs.seqlens_q.size());
    const int d = cs.head_dim;
    std::vector<SeqDesc> seqs(batch);
    int total_q = 0, total_k = 0, max_q = 0, max_k = 0;
    for (int b = 0; b < batch; ++b) {
        seqs[b] = {total_q, total_k, cs.seqlens_q[b], cs.seqlens_k[b]};
        total_q += cs.seqlens_q[b];
        total_k += cs.seqlens_k[b];
        max_q = std::max(max_q, cs.seqlens_q[b]);
        max_k = std::max(max_k, cs.seqlens_k[b]);
    }
    if (!cs.varlen) {
        // The padded layout: every sequence has the same lengths.
        for (int b = 0; b < batch; ++b) {
            seqs[b] = {b * max_q, b * max_k, max_q, max_k};
        }
        total_q = batch * max_q;
        total_k = batch * max_k;
    }
    const int64_t q_row = int64_t(cs.heads) * d, kv_row = int64_t(cs.heads_k) * d + cs.row_pad;
    const int64_t o_row = q_row + cs.row_pad;

    Buffers buf;
    const int64_t nq = std::max<int64_t>(total_q * q_row, 8), nk = std::max<int64_t>(total_k * kv_row, 8);
    CUDA_CHECK(cudaMalloc(&buf.q, nq * 2));
    CUDA_CHECK(cudaMalloc(&buf.k, nk * 2));
    CUDA_CHECK(cudaMalloc(&buf.v, nk * 2));
    buf.o_bytes = int64_t(total_q) * o_row * 2;
    buf.lse_bytes = int64_t(cs.varlen ? total_q : batch * max_q) * cs.heads * 4;
    CUDA_CHECK(cudaMalloc(&buf.o, buf.o_bytes + kGuardBytes));
    CUDA_CHECK(cudaMalloc(&buf.lse, buf.lse_bytes + kGuardBytes));
    fill_normal<<<blocks_for(nq), 256, 0, stream>>>(buf.q, nq, seed * 3 + 0, bf16);
    fill_normal<<<blocks_for(nk), 256, 0, stream>>>(buf.k, nk, seed * 3 + 1, bf16);
    fill_normal<<<blocks_for(nk), 256, 0, stream>>>(buf.v, nk, seed * 3 + 2, bf16);
    CUDA_CHECK(cudaMemsetAsync(buf.o, 0xff, buf.o_bytes + kGuardBytes, stream));
    CUDA_CHECK(cudaMemsetAsync(buf.lse, 0xff, buf.lse_bytes + kGuardBytes, stream));

    std::vector<int> cu_q(batch + 1), cu_k(batch + 1);
    for (int b = 0; b <= batch; ++b) {
        cu_q[b] = b < batch ? seqs[b].q_start : total_q;
        cu_k[b] = b < batch ? seqs[b].k_start : total_k;
    }
    int *d_cu_q, *d_cu_k;
    SeqDesc *d_seqs;
    CUDA_CHECK(cudaMalloc(&d_cu_q, (batch + 1) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_cu_k, (batch + 1) * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_seqs, batch * sizeof(SeqDesc)));
    CUDA_CHECK(cudaMemcpy(d_cu_q, cu_q.data(), (batch + 1) * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_cu_k, cu_k.data(), (batch + 1) * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_seqs, seqs.data(), batch * sizeof(SeqDesc), cudaMemcpyHostToDevice));
    void *workspace;
    const size_t workspace_bytes =
        std::max<size_t>(flash::sm90::fwd_workspace_size(cs.causal, cs.varlen ? batch : 0), 1);
    CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    CUDA_CHECK(cudaMemsetAsync(workspace, 0xff, workspace_bytes, stream));

    Flash_fwd_params p{};
    p.q_ptr = buf.q;
    p.k_ptr = buf.k;
    p.v_ptr = buf.v;
    p.o_ptr = buf.o;
    p.softmax_lse_ptr = buf.lse;
    p.q_row_stride = q_row;
    p.k_row_stride = p.v_row_stride = kv_row;
    p.o_row_stride = o_row;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
    p.q_batch_stride = cs.varlen ? 0 : int64_t(max_q) * q_row;
    p.k_batch_stride = p.v_batch_stride = cs.varlen ? 0 : int64_t(max_k) * kv_row;
    p.o_batch_stride = cs.varlen ? 0 : int64_t(max_q) * o_row;
    p.batch = batch;
    p.seqlen_q = max_q;
    p.seqlen_k = max_k;
    p.cu_seqlens_q = cs.varlen ? d_cu_q : nullptr;
    p.cu_seqlens_k = cs.varlen ? d_cu_k : nullptr;
    p.total_q = total_q;
    p.total_k = total_k;
    p.num_heads = cs.heads;
    p.num_heads_k = cs.heads_k;
    p.window_left = cs.window_left;
    p.window_right = cs.causal ? 0 : cs.window_right;
    p.softmax_scale = 1.f / std::sqrt(float(d));
    p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
    p.fwd_workspace = workspace;

    run_fwd(cs.dtype, cs.causal, d, p, stream);
    const cudaError_t launch_err = cudaGetLastError();

    float *o_ref, *lse_ref;
    CUDA_CHECK(cudaMalloc(&o_ref, std::max<int64_t>(int64_t(total_q) * q_row, 1) * 4));
    CUDA_CHECK(cudaMalloc(&lse_ref, std::max<int64_t>(buf.lse_bytes, 4)));
    RefArgs ra{buf.q, buf.k, buf.v, q_row, kv_row, kv_row, d, d, d, d_seqs, cs.heads, cs.heads_k, d, max_k,
               cs.window_left, cs.window_right, p.softmax_scale, cs.causal, bf16, cs.varlen, total_q, max_q,
               o_ref, lse_ref};
    if (max_q > 0) {
        const size_t smem = (max_k + d + 32) * sizeof(float);
        CUDA_CHECK(cudaFuncSetAttribute(reference_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        reference_attention<<<dim3(max_q, cs.heads, batch), 128, smem, stream>>>(ra);
    }
    CompareResult *d_res;
    CUDA_CHECK(cudaMalloc(&d_res, sizeof(CompareResult)));
    CUDA_CHECK(cudaMemsetAsync(d_res, 0, sizeof(CompareResult), stream));
    const int64_t n_o = int64_t(total_q) * q_row;
    if (n_o > 0) {
        compare_o<<<blocks_for(n_o), 256, 0, stream>>>(buf.o, o_row, d, o_ref, total_q, cs.heads, d, bf16, d_res);
        compare_lse<<<blocks_for(buf.lse_bytes / 4), 256, 0, stream>>>(buf.lse, lse_ref, buf.lse_bytes / 4, d_res);
    }
    check_guard<<<blocks_for(kGuardBytes), 256, 0, stream>>>(reinterpret_cast<uint8_t *>(buf.o) + buf.o_bytes,
                                                             kGuardBytes, d_res);
    check_guard<<<blocks_for(kGuardBytes), 256, 0, stream>>>(reinterpret_cast<uint8_t *>(buf.lse) + buf.lse_bytes,
                                                             kGuardBytes, d_res);
    CompareResult r;
    const cudaError_t sync_err = cudaStreamSynchronize(stream);
    if (sync_err != cudaSuccess) {
        std::printf("FAIL %-52s CUDA error %s\n", cs.name.c_str(), cudaGetErrorString(sync_err));
        std::exit(1);
    }
    CUDA_CHECK(cudaMemcpy(&r, d_res, sizeof(r), cudaMemcpyDeviceToHost));

    const float tol = bf16 ? 2e-2f : 4e-3f;
    const float rel = r.max_ref > 0.f ? r.max_err / r.max_ref : r.max_err;
    const bool ok = launch_err == cudaSuccess && r.nan_count == 0 && rel <= tol && r.lse_bad == 0 && r.guard_bad == 0;
    std::printf("%s %-56s err/max|ref| %.2e (tol %.0e)  max|ref| %.3f  lse err %.1e  nan %u lse_bad %u guard %u%s%s\n",
                ok ? "ok  " : "FAIL", cs.name.c_str(), rel, tol, r.max_ref, r.max_lse_err, r.nan_count, r.lse_bad,
                r.guard_bad, launch_err == cudaSuccess ? "" : "  launch: ",
                launch_err == cudaSuccess ? "" : cudaGetErrorString(launch_err));

    for (void *ptr : {(void *)buf.q, (void *)buf.k, (void *)buf.v, (void *)buf.o, (void *)buf.lse, (void *)o_ref,
                      (void *)lse_ref, (void *)d_res, (void *)d_cu_q, (void *)d_cu_k, (void *)d_seqs, workspace}) {
        CUDA_CHECK(cudaFree(ptr));
    }
    return ok;
}

// quick: the first dtype, three lengths (non-causal and causal, whose schedules differ: tile_queue.h);
// only_head_dim: that head dim alone (0: all).
static std::vector<Case> check_cases(bool quick, int only_head_dim) {
    std::vector<Case> cases;
    const std::vector<std::pair<int, int>> lengths =
        quick ? std::vector<std::pair<int, int>>{{17, 17}, {200, 128}, {128, 1000}}
              : std::vector<std::pair<int, int>>{{1, 1},     {17, 17},     {128, 128},  {200, 200},  {1000, 1000},
                                                 {4096, 4096}, {1, 1000},  {1000, 1},   {17, 200},   {200, 17},
                                                 {128, 1000}, {1000, 128}, {4096, 1000}, {1000, 4096}};
    for (int d : built_head_dims()) {
        if (only_head_dim != 0 && d != only_head_dim) {
            continue;
        }
        for (Dtype dtype : built_dtypes()) {
            for (bool causal : {false, true}) {
                auto name = [&](const char *what) {
                    char s[128];
                    std::snprintf(s, sizeof(s), "d=%d %s %s %s", d, dtype == Dtype::kBf16 ? "bf16" : "fp16",
                                  causal ? "causal" : "full  ", what);
                    return std::string(s);
                };
                for (auto [sq, sk] : lengths) {
                    char what[64];
                    std::snprintf(what, sizeof(what), "b=2 h=4 sq=%d sk=%d", sq, sk);
                    cases.push_back({name(what), d, 4, 4, causal, dtype, {sq, sq}, {sk, sk}, false, 0});
                }
                cases.push_back({name("GQA 8/2 b=2 sq=sk=1000"), d, 8, 2, causal, dtype, {1000, 1000}, {1000, 1000},
                                 false, 0});
                cases.push_back({name("MQA 4/1 padded rows b=3 sq=200 sk=300"), d, 4, 1, causal, dtype,
                                 {200, 200, 200}, {300, 300, 300}, false, 64});
                cases.push_back({name("varlen b=7 mixed incl. empty"), d, 4, 4, causal, dtype,
                                 {17, 0, 300, 1, 129, 1000, 64}, {17, 5, 300, 200, 0, 1000, 700}, true, 0});
                cases.push_back({name("varlen GQA 8/2 padded rows b=3"), d, 8, 2, causal, dtype, {128, 255, 1},
                                 {500, 128, 1}, true, 8});
                // Most tiles empty: a producer runs through them ahead of its consumers.
                cases.push_back({name("varlen b=9 one long sequence among empty ones"), d, 4, 4, causal, dtype,
                                 {0, 0, 0, 2000, 0, 0, 0, 0, 1}, {7, 0, 0, 2000, 0, 300, 0, 0, 1}, true, 0});
                cases.push_back({name("window left 100 right 30 b=2 sq=1000 sk=1000"), d, 4, 4, causal, dtype,
                                 {1000, 1000}, {1000, 1000}, false, 0, 100, 30});
                cases.push_back({name("window left 300 right 0 b=2 sq=200 sk=1000"), d, 4, 4, causal, dtype,
                                 {200, 200}, {1000, 1000}, false, 0, 300, 0});
                // More tiles than SMs: the static schedule's rounds (tile_queue.h), whose last is partial.
                cases.push_back({name("window left 256 right 256 b=4 h=16 sq=sk=2000"), d, 16, 16, causal, dtype,
                                 {2000, 2000, 2000, 2000}, {2000, 2000, 2000, 2000}, false, 0, 256, 256});
            }
            if (quick) {
                break;
            }
        }
    }
    return cases;
}

static int check(bool quick, int only_head_dim) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    int failed = 0, total = 0;
    uint64_t seed = 1;
    for (const Case &cs : check_cases(quick, only_head_dim)) {
        failed += !run_case(cs, stream, seed++);
        ++total;
    }
    std::printf("\n%d of %d cases passed\n", total - failed, total);
    return failed == 0 ? 0 : 1;
}

// The paper's grid: bf16, batch * seqlen = 16k tokens, hidden 2048 (heads = 2048 / d). rows > 0:
// rows query rows per sequence instead of seqlen (decode-like problems), non-causal only.
static int bench(int only_seqlen, int rows_q) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    constexpr int kSets = 3, kWarmup = 5, kRuns = 30;
    std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
    if (only_seqlen > 0) {
        seqlens = {only_seqlen};
    }
    struct Row {
        int d;
        bool causal;
        int seqlen;
        double ms, tflops;
    };
    std::vector<Row> results;
    int window_left = kWindowUnbounded, window_right = kWindowUnbounded;
    if (const char *window = std::getenv("BENCH_WINDOW")) {
        if (std::sscanf(window, "%d,%d", &window_left, &window_right) != 2) {
            std::fprintf(stderr, "BENCH_WINDOW: expected left,right\n");
            return 2;
        }
    }
    for (int d : {64, 128, 256}) {
        if (std::find(built_head_dims().begin(), built_head_dims().end(), d) == built_head_dims().end()) {
            continue;
        }
        for (bool causal : {false, true}) {
            if (causal && rows_q > 0) {
                continue;
            }
            for (int s : seqlens) {
                const int batch = 16384 / s, heads = 2048 / d, sq = rows_q > 0 ? rows_q : s;
                const int64_t n = int64_t(batch) * s * heads * d, n_q = int64_t(batch) * sq * heads * d;
                uint16_t *q[kSets], *k[kSets], *v[kSets], *o;
                float *lse;
                for (int i = 0; i < kSets; ++i) {
                    CUDA_CHECK(cudaMalloc(&q[i], n_q * 2));
                    CUDA_CHECK(cudaMalloc(&k[i], n * 2));
                    CUDA_CHECK(cudaMalloc(&v[i], n * 2));
                    fill_normal<<<blocks_for(n_q), 256, 0, stream>>>(q[i], n_q, 100 + 3 * i, true);
                    fill_normal<<<blocks_for(n), 256, 0, stream>>>(k[i], n, 101 + 3 * i, true);
                    fill_normal<<<blocks_for(n), 256, 0, stream>>>(v[i], n, 102 + 3 * i, true);
                }
                CUDA_CHECK(cudaMalloc(&o, n_q * 2));
                CUDA_CHECK(cudaMalloc(&lse, int64_t(batch) * heads * sq * 4));
                void *workspace;
                CUDA_CHECK(cudaMalloc(&workspace, std::max<size_t>(flash::sm90::fwd_workspace_size(causal, 0), 1)));
                Flash_fwd_params p{};
                p.o_ptr = o;
                p.fwd_workspace = workspace;
                p.softmax_lse_ptr = lse;
                p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(heads) * d;
                p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
                p.k_batch_stride = p.v_batch_stride = int64_t(s) * heads * d;
                p.q_batch_stride = p.o_batch_stride = int64_t(sq) * heads * d;
                p.batch = batch;
                p.seqlen_q = sq;
                p.seqlen_k = s;
                p.total_q = batch * sq;
                p.total_k = batch * s;
                p.num_heads = p.num_heads_k = heads;
                p.window_left = window_left;
                p.window_right = causal ? 0 : window_right;
                p.softmax_scale = 1.f / std::sqrt(float(d));
                p.softmax_scale_log2 = p.softmax_scale * 1.4426950408889634f;
                std::vector<float> times;
                for (int it = 0; it < kWarmup + kRuns; ++it) {
                    p.q_ptr = q[it % kSets];
                    p.k_ptr = k[it % kSets];
                    p.v_ptr = v[it % kSets];
                    CUDA_CHECK(cudaEventRecord(start, stream));
                    run_fwd(Dtype::kBf16, causal, d, p, stream);
                    CUDA_CHECK(cudaEventRecord(stop, stream));
                    CUDA_CHECK(cudaGetLastError());
                    CUDA_CHECK(cudaEventSynchronize(stop));
                    float ms;
                    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
                    if (it >= kWarmup) {
                        times.push_back(ms);
                    }
                }
                std::sort(times.begin(), times.end());
                const double ms = times[times.size() / 2];
                const double flops = 4.0 * sq * s * d * heads * batch / (causal ? 2 : 1);
                results.push_back({d, causal, s, ms, flops / (ms * 1e-3) / 1e12});
                std::printf("d=%3d %-6s rows %5d seqlen %5d batch %2d heads %2d: %8.3f ms  %6.1f TFLOPs/s\n", d,
                            causal ? "causal" : "full", sq, s, batch, heads, ms, results.back().tflops);
                for (int i = 0; i < kSets; ++i) {
                    CUDA_CHECK(cudaFree(q[i]));
                    CUDA_CHECK(cudaFree(k[i]));
                    CUDA_CHECK(cudaFree(v[i]));
                }
                CUDA_CHECK(cudaFree(o));
                CUDA_CHECK(cudaFree(lse));
                CUDA_CHECK(cudaFree(workspace));
            }
        }
    }
    std::printf("\nTFLOPs/s (bf16, 16k tokens, hidden 2048; median of %d runs over %d input sets)\n", kRuns, kSets);
    std::printf("| d | causal |");
    for (int s : seqlens) {
        std::printf(" %d |", s);
    }
    std::printf("\n|---|---|");
    for (size_t i = 0; i < seqlens.size(); ++i) {
        std::printf("---|");
    }
    for (size_t i = 0; i < results.size(); ++i) {
        if (i % seqlens.size() == 0) {
            std::printf("\n| %d | %s |", results[i].d, results[i].causal ? "yes" : "no");
        }
        std::printf(" %.0f |", results[i].tflops);
    }
    std::printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    const std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "check") {
        return check(argc > 2 && std::string(argv[2]) == "quick", argc > 3 ? std::atoi(argv[3]) : 0);
    }
    if (mode == "bench") {
        return bench(argc > 2 ? std::atoi(argv[2]) : 0, argc > 3 ? std::atoi(argv[3]) : 0);
    }
    std::fprintf(stderr, "usage: %s check [quick|all [head dim]] | bench [seqlen [rows]]\n", argv[0]);
    return 2;
}
