// How a persistent block gets its tiles (indices into TileScheduler's order). Each block starts
// with tile blockIdx.x; the loops run while the index is below num_tiles.
//
// Static: static_tiles.h (rounds of one index per block, rotated).
//
// Dynamic: the producer thread claims each next tile from a global counter (gridDim.x + atomicAdd),
// as its current tile's last KV block loads (the backward's: its last Q block), so that the tile
// goes to a block that is about to be free. With the costly tiles first in the order, this greedy
// assignment evens out the last wave. The producer hands each index to the consumers through a ring
// of slots in shared memory, each slot guarded by two mbarriers:
//   producer:  wait empty[s], write tile[s], arrive on full[s] (1 arrival)
//   consumers: every consumer thread waits full[s], reads tile[s], arrives on empty[s]
// s goes round the ring and each side flips its phase parity at every wrap; the producer starts at
// parity 1, which a fresh barrier reports as completed: the slots start empty. Every claimed index
// is handed over, the first one >= num_tiles too, which ends the loops of both sides. The producer
// hands over tile t + 1 once it has issued every load of tile t, into the slot that held tile t - 1:
// the consumers free it when they finish tile t - 2, from loads already issued, so no wait of one
// side on the other closes a cycle.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "common/flash.h"
#include "sm90/workspace.h"
#include "sm90/static_tiles.h"

namespace flash::sm90 {

struct TileRing {
    static constexpr int kSlots = 2;
    int64_t tile[kSlots];
    uint64_t full[kSlots];
    uint64_t empty[kSlots];

    __device__ __forceinline__ void init(int consumer_threads) {
        for (int s = 0; s < kSlots; ++s) {
            cutlass::arch::ClusterBarrier::init(&full[s], 1);
            cutlass::arch::ClusterBarrier::init(&empty[s], consumer_threads);
        }
    }
};

// The shared memory of the static schedule.
struct NoTileRing {};

// The type of the parameter field that points at the counter (Flash_fwd_params::fwd_workspace,
// Flash_bwd_params::bwd_scratch).
using CounterField = void *__restrict__;

// Lane 0's value, which ptxas then knows to be the same across the warp: the tile's coordinates and
// KV range stay in uniform registers, as with the static schedule (the producer has 24 registers).
// lanes: the lanes that run the call, lane 0 among them.
__device__ __forceinline__ int64_t warp_uniform(int64_t x, unsigned lanes) { return __shfl_sync(lanes, x, 0); }

// Slot and phase parity of the n-th use of the ring by one side.
__device__ __forceinline__ int ring_slot(uint32_t n) { return n % TileRing::kSlots; }
__device__ __forceinline__ uint32_t ring_phase(uint32_t n) { return (n / TileRing::kSlots) & 1; }

template <bool kDynamic>
struct ProducerTiles;
template <bool kDynamic>
struct ConsumerTiles;

template <>
struct ProducerTiles<false> : StaticTiles {
    template <class Ring>  // NoTileRing, or a TileRing that a static schedule leaves unused
    __device__ __forceinline__ ProducerTiles(Ring &, CounterField const &, int64_t num_tiles_)
        : StaticTiles{num_tiles_} {}
    __device__ __forceinline__ void claim() {}
};

template <>
struct ConsumerTiles<false> : StaticTiles {
    template <class Ring>
    __device__ __forceinline__ ConsumerTiles(Ring &, int64_t num_tiles_) : StaticTiles{num_tiles_} {}
};

template <>
struct ProducerTiles<true> {
    TileRing &ring;
    CounterField const &counter;  // the kernel parameter's field, read when used
    TileCounter claimed = 0;
    uint32_t handed_over = 0;

    __device__ __forceinline__ ProducerTiles(TileRing &ring_, CounterField const &counter_, int64_t)
        : ring(ring_), counter(counter_) {}
    __device__ __forceinline__ int64_t first() const { return blockIdx.x; }
    // Once per tile, before next(): the atomic's result is first read there, or by peek() at the
    // end of a varlen tile (fwd_producer.h), after the tile's last loads.
    __device__ __forceinline__ void claim() {
        claimed = atomicAdd(static_cast<TileCounter *>(counter), TileCounter(1));
    }
    // The index next() will return, once the tile's claim() is made.
    __device__ __forceinline__ int64_t peek() const { return int64_t(gridDim.x) + int64_t(claimed); }
    __device__ __forceinline__ int64_t next() {
        const int64_t tile = warp_uniform(peek(), 1u);
        const int s = ring_slot(handed_over);
        cutlass::arch::ClusterBarrier::wait(&ring.empty[s], ring_phase(handed_over) ^ 1);
        ring.tile[s] = tile;
        cutlass::arch::ClusterBarrier::arrive(&ring.full[s]);
        ++handed_over;
        return tile;
    }
};

template <>
struct ConsumerTiles<true> {
    TileRing &ring;
    uint32_t taken = 0;

    __device__ __forceinline__ ConsumerTiles(TileRing &ring_, int64_t) : ring(ring_) {}
    __device__ __forceinline__ int64_t first() const { return blockIdx.x; }
    __device__ __forceinline__ int64_t next() {
        const int s = ring_slot(taken);
        cutlass::arch::ClusterBarrier::wait(&ring.full[s], ring_phase(taken));
        const int64_t tile = ring.tile[s];
        cutlass::arch::ClusterBarrier::arrive(&ring.empty[s]);
        ++taken;
        return warp_uniform(tile, 0xffffffffu);
    }
};

}  // namespace flash::sm90
