"""How many chunks split-KV cuts each batch's keys into when num_splits=0: the count whose step a
cost model of the Hopper forward's persistent grid rates fastest. Fitted to run 388's sweep
(benchmarks/kvcache_splits.py, H200, d=64 and 128, GQA and not; benchmarks/NOTES.md); on the sweeps
of runs 389 and 391, not fitted to, its picks take 1.1-1.6% more time than the fastest count on
average (10-16% at worst), against 7-11% (34-85%) for the rule it replaced (run 383). The merge's
cost refitted to run 394's sweep, once the merge started under the forward (dependent launch).

The model: the grid takes its tiles in static rounds of one tile per block (sm90/static_tiles.h), a
tile per (sequence, head, row block) with the sequences in kvcache_layout's order (per batch, the
rows before its keys, then its chunks; one last gap), the gaps being tiles without query rows that
end at once. A step costs, per round that holds a chunk's tile, that chunk's keys plus a tile's
fixed time, and the merge's time where there is more than one chunk. A key costs the same at
every head dim: a decoding tile waits on its loads one block after the other (the fit found no
better exponent of d than 0 on d=64 and 128)."""

import functools
import math

from flash_attn_cuda.kvcache_layout import chunk_length

# The chunk counts the sweep measured, from which num_splits=0 picks: not 2, which ran up to 12%
# slower than the model rates it where it takes several rounds (batch 32 at 4k keys: 176 us against
# 157 for three chunks, runs 388-391).
CANDIDATES = (1, 3, 4, 6, 8, 12, 16)
# A tile's fixed time and the merge kernel's, as the time of that many keys through a tile (the
# merge's was 800 while it waited for the forward's end to launch).
TILE_KEYS = 600
MERGE_KEYS = 100
# Query rows per tile (the forward's row block at d=128).
ROW_BLOCK = 128


def busy_rounds(splits, batch, tiles_per_sequence, chunks, sms):
    """The static rounds up to the last one that holds a tile of a chunk with keys: each batch's
    sequences are its gap then its splits chunks (the first `chunks` of them hold keys), and one last
    gap follows; each sequence is tiles_per_sequence consecutive tile indices."""
    tiles = tiles_per_sequence * (batch * (splits + 1) + 1)
    grid = min(tiles, sms)
    for last_round in range(math.ceil(tiles / grid), 0, -1):
        first = (last_round - 1) * grid // tiles_per_sequence
        last = (min(last_round * grid, tiles) - 1) // tiles_per_sequence
        if any(j < batch * (splits + 1) and 0 < j % (splits + 1) <= chunks for j in range(first, last + 1)):
            return last_round
    return 1


@functools.lru_cache(maxsize=4096)
def auto_splits(batch, rows, heads, longest, sms):
    """The chunk count for batch sequences of `rows` query rows over `heads` heads of K and V and
    at most `longest` keys, on a GPU of `sms` SMs (fewest chunks among equal costs)."""
    if longest <= 0:
        return 1
    tiles_per_sequence = heads * math.ceil(rows / ROW_BLOCK)

    def cost(splits):
        chunk = chunk_length(longest, splits)
        rounds = busy_rounds(splits, batch, tiles_per_sequence, math.ceil(longest / chunk), sms)
        return rounds * (chunk + TILE_KEYS) + (MERGE_KEYS if splits > 1 else 0)

    return min(CANDIDATES, key=lambda splits: (cost(splits), splits))
