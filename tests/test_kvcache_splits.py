"""kvcache_splits' model of split-KV's chunk count (CPU): the static rounds of the persistent grid
over the layout's sequences, and the counts it picks at the ends of the range."""

import pytest

from flash_attn_cuda.kvcache_layout import SPLIT_ALIGN, chunk_length
from flash_attn_cuda.kvcache_splits import CANDIDATES, auto_splits, busy_rounds


@pytest.mark.parametrize("longest, splits, expected", [(16384, 1, 16384), (16384, 3, 5504), (1000, 4, 256),
                                                       (100, 16, SPLIT_ALIGN)])
def test_chunk_lengths(longest, splits, expected):
    assert chunk_length(longest, splits) == expected


@pytest.mark.parametrize("splits, batch, heads, sms, expected", [
    (6, 2, 8, 132, 1),   # 15 sequences x 8 heads = 120 tiles: one round
    (8, 2, 8, 132, 2),   # 152 tiles: the second round holds batch 1's last chunks
    (3, 4, 8, 132, 1),   # 136 tiles: the second round holds only the last gap
    (1, 64, 8, 132, 8),  # 129 sequences x 8 heads = 1032 tiles in 8 rounds, the last with keys
    (2, 1, 32, 132, 1),  # 128 tiles, one per block
])
def test_busy_rounds_follow_the_static_schedule(splits, batch, heads, sms, expected):
    assert busy_rounds(splits, batch, heads, splits, sms) == expected


def test_empty_chunks_hold_no_tile_of_their_own():
    # 16 chunks of 128 keys cover 1024 keys with 8: with 8 heads, the 144 tiles' second round holds
    # chunk 16's tiles, which are empty, and the last gap.
    assert busy_rounds(16, 1, 8, 8, 132) == 1
    assert busy_rounds(16, 1, 8, 16, 132) == 2


def test_auto_splits_splits_long_caches_of_small_batches_only():
    assert auto_splits(1, 4, 8, 512, 132) == 4  # run 394: 11.0 us a step against 13.2 unsplit
    assert auto_splits(32, 4, 8, 512, 132) == 1
    assert auto_splits(1, 4, 8, 16384, 132) >= 8
    assert auto_splits(4, 4, 8, 16384, 132) == 3  # 4 x 4 + 1 sequences x 8 heads: one round and a gap
    assert auto_splits(8, 4, 8, 1024, 132) == 1
    assert auto_splits(1, 1, 8, 0, 132) == 1
    assert all(auto_splits(b, 1, 8, n, 132) in CANDIDATES for b in (1, 3, 50) for n in (1, 700, 9000))
