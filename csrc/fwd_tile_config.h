// The forward dispatch table: tile shape per (head dim, causal, arch).
// Shared by the launcher (compile time) and flash_api.cpp (exposed to Python for tests).
#pragma once

struct FwdTileConfig {
    int block_m;    // rows of Q per thread block (B_r in the paper)
    int block_n;    // rows of K/V per inner iteration (B_c in the paper)
    int num_warps;  // warps split the block_m rows of Q between them
    int num_stages; // shared-memory buffers per K and V tile
};

// Measured on H100 (sm_90) with benchmarks/benchmark_attn.py; the numbers that chose each entry
// are in benchmarks/NOTES.md. sm_8x uses the same table: it has not been tuned on an A100.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool causal, int sm) {
    (void)causal;
    (void)sm;
    return head_dim <= 64    ? FwdTileConfig{128, 64, 4, 1}
           : head_dim <= 128 ? FwdTileConfig{128, 64, 4, 1}
           : head_dim <= 192 ? FwdTileConfig{64, 64, 4, 1}
                             : FwdTileConfig{64, 32, 4, 1};
}
