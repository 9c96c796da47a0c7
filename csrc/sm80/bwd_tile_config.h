// The backward dispatch table: tile shape and warp layouts per kernel head dim. Shared by the
// launcher (compile time) and family.cpp (the dQ scratch buffers are padded to block_m rows;
// exposed to Python for tests).
#pragma once

namespace flash::sm80 {

struct BwdTileConfig {
    int block_m;       // rows of Q (and dO) per inner iteration (B_r in the paper)
    int block_n;       // rows of K and V per thread block (B_c in the paper)
    int num_warps;
    int atom_m_sdp;    // warps along M for S = Q K^T and dP = dO V^T (the rest along N)
    int atom_m_dkv;    // warps along M (rows of K) for dK and dV
    int atom_m_dq;     // warps along M for dQ
    int stages_q_do;   // shared-memory buffers for Q and dO (2: the next block loads during compute)
    bool dq_before_dk; // dQ = dS K between the dV and the dK GEMM, its adds spread over the dK
                       // GEMM's k-steps (else dQ and its adds after dK)
};

// The shared memory each entry needs (K, V, stages x (Q, dO), P, dS; 2-byte elements) fits sm80's
// 163 KB; on sm86/sm89 (99 KB) the entries above 99 KB raise a clear error (api/attention.cpp).
// large_smem: an entry that needs more room (up to sm90's 227 KB), where one is faster; the launcher
// takes it on a GPU that has the room for it. Both keep block_m, which sizes the dQ scratch.
// Numbers behind each entry: benchmarks/NOTES.md.
constexpr BwdTileConfig bwd_tile_config(int head_dim, bool large_smem = false) {
    switch (head_dim) {
        case 32:
        case 64:
            // 128x128 beat 64x128 by 10-14% at seqlen 4k-16k and 8% at 1k (d=64, H100). Two Q/dO
            // buffers with dQ between dV and dK, its adds spread over the dK GEMM: +4-7% non-causal
            // and +1-2.5% causal over one buffer with dQ last (runs 26, 29).
            return {128, 128, 8, 4, 4, 4, 2, true};
        case 96:
            // Two Q/dO buffers: +4-7% over one (run 25); dQ between dV and dK: +4-6% (run 30).
            return {64, 128, 8, 2, 4, 4, 2, true};
        case 128:
            // dQ on 2x4 warps (+4%) over 4x2 warps. Two Q/dO buffers: they lost 3-7% to one while
            // the dQ adds were atomics returning their old values (run 3), and won 3-12% over one
            // (even with its early load) once the adds were reductions (run 17). dQ between dV and
            // dK: +3-4% non-causal, +2% causal at 1k-4k, -1% causal 16k (run 30).
            return {64, 128, 8, 2, 4, 2, 2, true};
        case 160:
            // Two Q/dO buffers (136 KB: not on sm86/sm89, where one buffer fits), dQ between dV and
            // dK, S and dP on 4x2 warps: +4-7% over one buffer (run 118).
            return large_smem ? BwdTileConfig{64, 64, 8, 4, 4, 4, 2, true}
                              : BwdTileConfig{64, 64, 8, 2, 4, 4, 1, false};
        case 192:
            // Two Q/dO buffers (160 KB, still within sm80's 163 KB), dQ between dV and dK, S and dP
            // on 4x2 warps, dK, dV and dQ on 2x4: +8-15% over one buffer on 2x4, 4x2, 4x2 (run 118).
            return {64, 64, 8, 4, 2, 2, 2, true};
        case 256:
            // S and dP on 4x2 warps, dK and dV on 2x4, dQ on 2x4: +5-6% over 2x4, 4x2, 4x2 (runs
            // 110-111, one buffer). With sm90's room, two Q/dO buffers (208 KB), dQ on 4x2 between
            // dV and dK: +10-15% over that at seqlen 512-16k (run 111).
            return large_smem ? BwdTileConfig{64, 64, 8, 4, 2, 4, 2, true}
                              : BwdTileConfig{64, 64, 8, 4, 2, 2, 1, false};
        default:
            return {64, 64, 8, 2, 4, 4, 1, false};
    }
}

constexpr int bwd_smem_bytes(const BwdTileConfig &cfg, int head_dim) {
    return 2 * (2 * cfg.block_n * head_dim + 2 * cfg.stages_q_do * cfg.block_m * head_dim +
                2 * cfg.block_m * cfg.block_n);
}

}  // namespace flash::sm80
