// The forward dispatch table: tile shape per (kernel head dim, causal). Shared by the launcher
// (compile time) and the build info (exposed to Python for tests).
#pragma once

namespace flash::sm80 {

struct FwdTileConfig {
    int block_m;    // rows of Q per thread block (B_r in the paper)
    int block_n;    // rows of K/V per inner iteration (B_c in the paper)
    int num_warps;  // warps split the block_m rows of Q between them
};

// Chosen on H100 (sm_90) with benchmarks/tune/tune.sh, bf16, the paper's grid; the numbers
// behind each entry are in benchmarks/NOTES.md. sm_8x uses the same table: no A100 was available
// to tune on. The d=128 entry (212 bytes) and d=64 non-causal (180 bytes) spill (ptxas -v) and are
// still the fastest shapes; the others compile without spills.
constexpr FwdTileConfig fwd_tile_config(int head_dim, bool causal, bool dropout = false) {
    if (dropout) {
        // The dropout kernel holds the mask bits and the Philox state on top: with 128 rows of Q
        // the d=128 kernel spilled 1.1 KB (ptxas -v), with 64 none.
        return head_dim <= 64 ? FwdTileConfig{64, 128, 4} : FwdTileConfig{64, 64, 4};
    }
    switch (head_dim) {
        case 64:
            // Non-causal: 128x128 beats 128x64 (both 4 warps) at every length, by 13% at 512 and
            // 1-2% at 8k-16k (runs 12 and 13); causal: 128x64 is ahead at 512 and 8k-16k.
            return causal ? FwdTileConfig{128, 64, 4} : FwdTileConfig{128, 128, 4};
        case 32:
        case 96:
            return {128, 64, 4};
        case 128:
            // 128x64 on 4 warps beats 128x128 on 8 at 512-4k: causal by 1-12% (run 12: 264 / 302
            // vs 240 / 282 TFLOPs/s at 1k / 2k), non-causal by 10-16%.
            return {128, 64, 4};
        case 160:
        case 192:
        case 224:
        case 256:
        default:
            return {64, 64, 4};
    }
}

}  // namespace flash::sm80
