// The forward dispatch table: tile shape per (kernel head dim, causal, arch).
// Shared by the launcher (compile time) and flash_api.cpp (exposed to Python for tests).
#pragma once

struct FwdTileConfig {
    int block_m;    // rows of Q per thread block (B_r in the paper)
    int block_n;    // rows of K/V per inner iteration (B_c in the paper)
    int num_warps;  // warps split the block_m rows of Q between them
    int num_stages; // shared-memory buffers per K and V tile
};

// Chosen on H100 (sm_90) with benchmarks/tune/tune.sh, bf16, the paper's grid; the numbers
// behind each entry are in benchmarks/NOTES.md. sm_8x uses the same table: no A100 was available
// to tune on. The d=128 entry spills (ptxas -v: 212 bytes) and is still the fastest shape up to
// seqlen 4k; the others compile without spills.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool causal, int sm) {
    (void)causal;
    (void)sm;
    switch (head_dim) {
        case 32:
        case 64:
        case 96:
            return {128, 64, 4, 1};
        case 128:
            // 128x64 on 4 warps beats 128x128 on 8 at 512-4k: causal by 1-12% (run 12: 264 / 302
            // vs 240 / 282 TFLOPs/s at 1k / 2k), non-causal by 10-16%.
            return {128, 64, 4, 1};
        case 160:
        case 192:
        case 224:
        case 256:
        default:
            return {64, 64, 4, 1};
    }
}
