// setmaxnreg's budget. A block starts with the registers ptxas gives each thread under
// __launch_bounds__(threads, 1): 64K / threads, rounded down to a multiple of 8 (168 for 384
// threads, not 170). The load warpgroup's setmaxnreg.dec gives registers back to the block's pool and
// the consumers' setmaxnreg.inc takes them from it, waiting until the pool holds enough: a split that
// needs more than the block started with never completes, and the kernel hangs.
#pragma once

namespace flash::sm90 {

constexpr int registers_at_launch(int threads) { return 65536 / threads / 8 * 8; }

// One load warpgroup of 128 threads at producer registers, consumer_threads at consumer registers.
constexpr bool registers_fit(int producer, int consumer, int consumer_threads) {
    return producer * 128 + consumer * consumer_threads <=
           registers_at_launch(consumer_threads + 128) * (consumer_threads + 128);
}

}  // namespace flash::sm90
