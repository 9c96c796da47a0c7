// Host check of the Hopper forward's tile decode (csrc/sm90/tile_scheduler.h), built by
// tests/test_host_checks.py: FastDivmod against / and %, and TileScheduler::coord against the
// decode written with plain divisions; every tile index maps to a distinct (row block, head, batch).
#include <cstdio>
#include <random>
#include <vector>

#include "sm90/tile_scheduler.h"

using flash::FastDivmod;
using flash::sm90::TileCoord;
using flash::sm90::TileScheduler;

static long failures = 0;

static void check_divmod(int d, int n) {
    int q, r;
    const FastDivmod divmod(d);
    divmod(q, r, n);
    if (q != n / d || r != n % d) {
        if (failures++ < 5) printf("FastDivmod(%d) of %d: %d r %d\n", d, n, q, r);
    }
}

// The decode with plain divisions: causal tiles in groups of (batch, head) pairs, the first
// num_big_groups of group_size + 1 pairs, row blocks from the last.
static TileCoord reference_coord(bool causal, int64_t tile, int64_t m_blocks, int64_t heads, int64_t group_size,
                                 int64_t num_big_groups) {
    int64_t m, bh;
    if (causal) {
        const int64_t big_tiles = num_big_groups * (group_size + 1) * m_blocks;
        const int64_t size = tile < big_tiles ? group_size + 1 : group_size;
        const int64_t t = tile < big_tiles ? tile : tile - big_tiles;
        const int64_t g = t / (size * m_blocks), r = t % (size * m_blocks);
        const int64_t first = tile < big_tiles ? g * size : num_big_groups * (group_size + 1) + g * size;
        m = m_blocks - 1 - r / size;
        bh = first + r % size;
    } else {
        m = tile % m_blocks;
        bh = tile / m_blocks;
    }
    return {int(m), int(bh % heads), int(bh / heads)};
}

int main() {
    for (int d = 1; d < 3000; ++d) {
        for (int n = 0; n < 3000; ++n) {
            check_divmod(d, n);
        }
    }
    std::mt19937_64 rng(7);
    for (int i = 0; i < 2000000; ++i) {
        const int d = i % 2 ? int(rng() % 100000) + 1 : int(rng() % 2147483647u) + 1;
        check_divmod(d, int(rng() % 2147483648u));
    }
    check_divmod(2147483647, 2147483647);
    check_divmod(1, 2147483647);

    long tiles = 0;
    for (int m_blocks : {1, 2, 3, 8, 33, 257}) {
        for (int heads : {1, 3, 16, 40}) {
            for (int batch : {1, 2, 5, 33}) {
                for (int64_t budget : {int64_t(1), int64_t(1) << 24, int64_t(40) << 20, int64_t(1) << 40}) {
                    const TileScheduler s = flash::sm90::make_tile_scheduler(m_blocks, heads, batch, 3 << 20, budget);
                    for (bool causal : {false, true}) {
                        std::vector<char> seen(size_t(s.num_tiles), 0);
                        for (int64_t t = 0; t < s.num_tiles; ++t, ++tiles) {
                            const TileCoord c = causal ? s.coord<true>(t) : s.coord<false>(t);
                            const TileCoord want = reference_coord(causal, t, m_blocks, heads, s.group.divisor,
                                                                   s.big_pairs / s.big_group.divisor);
                            const bool in_range = c.m_block >= 0 && c.m_block < m_blocks && c.bidh >= 0 &&
                                                  c.bidh < heads && c.bidb >= 0 && c.bidb < batch;
                            if (!in_range || c.m_block != want.m_block || c.bidh != want.bidh || c.bidb != want.bidb) {
                                if (failures++ < 5) printf("tile %lld: (%d, %d, %d)\n", (long long)t, c.m_block, c.bidh, c.bidb);
                                continue;
                            }
                            char &hit = seen[size_t((int64_t(c.bidb) * heads + c.bidh) * m_blocks + c.m_block)];
                            if (hit++ && failures++ < 5) printf("tile %lld decoded twice\n", (long long)t);
                        }
                    }
                }
            }
        }
    }
    // The largest grids the family takes: the scheduler's sizes stay in 31 bits (all pairs in one
    // L2 group make a big-group divisor of num_tiles + num_m_blocks), and the last tiles decode.
    for (int batch : {32766, 32767, 32768}) {
        const int m_blocks = 65536, heads = 1;
        const bool fits = flash::sm90::tile_indices_fit(m_blocks, heads, batch);
        if (fits != (batch <= 32766) && failures++ < 5) printf("tile_indices_fit(%d, %d, %d) = %d\n", m_blocks, heads, batch, fits);
        if (!fits) {
            continue;
        }
        const TileScheduler s = flash::sm90::make_tile_scheduler(m_blocks, heads, batch, 512, 26214400);
        for (int64_t t = s.num_tiles - 3; t < s.num_tiles; ++t) {
            for (bool causal : {false, true}) {
                const TileCoord c = causal ? s.coord<true>(t) : s.coord<false>(t);
                const TileCoord want = reference_coord(causal, t, m_blocks, heads, s.group.divisor,
                                                       s.big_pairs / s.big_group.divisor);
                if ((c.m_block != want.m_block || c.bidh != want.bidh || c.bidb != want.bidb) && failures++ < 5) {
                    printf("large grid tile %lld: (%d, %d, %d)\n", (long long)t, c.m_block, c.bidh, c.bidb);
                }
            }
        }
    }
    printf("%ld tiles, %ld failures\n", tiles, failures);
    return failures != 0;
}
