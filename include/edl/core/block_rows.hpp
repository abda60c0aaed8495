// edl/core/block_rows.hpp
// The rows of a block of a row-major array: the one walk that copying a device's shard out of
// (or into) a tensor needs, whether the tensor is in memory (tensor/shard_layout.hpp's
// copy_block) or in a mapped file (io/safetensors.hpp's read_block).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace edl::detail {

/// Calls f(global_index, block_index, row_length) for every innermost run of the block at
/// `offset` of extent `block` in a row-major array of shape `global`; both indexes count
/// elements (block_index in the block stored contiguously). Runs come in the block's row-major
/// order; a rank-0 array is one run of one element.
template <class F>
void for_each_block_row(std::span<const std::int64_t> global, std::span<const std::int64_t> offset,
                        std::span<const std::int64_t> block, F&& f) {
  const std::size_t r = global.size();
  if (r == 0) {
    f(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
    return;
  }
  std::vector<std::int64_t> gstride(r, 1);
  for (std::size_t i = r - 1; i-- > 0;) gstride[i] = gstride[i + 1] * global[i + 1];
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < r; ++i) rows *= block[i];
  const std::int64_t row = block[r - 1];
  std::vector<std::int64_t> idx(r, 0);
  for (std::int64_t k = 0; k < rows; ++k) {
    std::int64_t g = 0;
    for (std::size_t i = 0; i < r; ++i) g += (offset[i] + idx[i]) * gstride[i];
    f(g, k * row, row);
    for (std::size_t i = r - 1; i-- > 0;) {  // odometer over all but the last dimension
      if (++idx[i] < block[i]) break;
      idx[i] = 0;
    }
  }
}

}  // namespace edl::detail
