// Paged K and V (Flash_fwd_params::block_table): where a varlen sequence's keys lie in the pages.
// Its first logical row k_start names the row of the block table (k_start / paged_rows) and its
// first key in that row's sequence. A block of keys that starts at a multiple of the block size
// lies in one page (flash.h's conditions), so the TMA loads it through one coordinate. Indices
// are clamped to the table and the pages: offsets the host could not check (CUDA graph capture)
// give wrong rows, never out-of-bounds ones.
#pragma once

#include "common/flash.h"

namespace flash::sm90 {

class PagedKeys {
  public:
    __device__ PagedKeys(Flash_fwd_params const &params, int k_start)
        : table_(params.block_table), page_size_(params.page_size), page_stride_(params.page_stride),
          last_page_(params.num_pages - 1) {
        if (table_ != nullptr) {
            const int sequence = k_start / params.paged_rows;
            first_key_ = k_start - sequence * params.paged_rows;
            last_entry_ = params.paged_rows / params.page_size - 1;
            table_ += sequence * params.block_table_stride;
        }
    }

    __device__ bool paged() const { return table_ != nullptr; }

    // The block table's entry for key `key` of the sequence (its index within the varlen sequence,
    // not counting the sequence's earlier chunks): loaded on its own, so that the load can be
    // issued a block ahead of its use (row).
    __device__ int entry(int key) const { return table_[min((first_key_ + key) / page_size_, last_entry_)]; }

    // Row of k and v that holds key `key`, whose page's entry is `entry`.
    __device__ int row(int key, int entry) const {
        return max(0, min(entry, last_page_)) * page_stride_ + (first_key_ + key) % page_size_;
    }

    // Of a sequence of `keys` keys: the key at the first row of the page that holds its last key.
    // A block that ends past the keys lies in that page, and loads its V through a descriptor of
    // the page's rows up to the last key (sequence_tensor_maps.h), whose extent (keys - tail_key)
    // makes the TMA fill the rest with zeros, as V's rows past a sequence must be (0 * NaN is NaN;
    // the split-block kernels zero them in shared memory instead).
    __device__ int tail_key(int keys) const { return (first_key_ + keys - 1) / page_size_ * page_size_ - first_key_; }

  private:
    const int *table_;
    int first_key_ = 0, last_entry_ = 0;
    int page_size_, page_stride_, last_page_;
};

}  // namespace flash::sm90
