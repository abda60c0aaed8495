// edl/quant/matrix.hpp
// A quantized weight matrix [rows, cols] (a Linear's weight, HF layout [out, in]). q8_0 and
// q4_0 lie in groups of 16 rows (quant/row_groups.hpp: the int8 kernels' layout), nf4 in rows
// of blocks; files hold GGUF's rows of blocks either way (file_bytes, copy_row).
//
//   quant::Matrix m = quant::Matrix::quantize(Format::q8_0, w, rows, cols, "q_proj.weight");
//   m.dequantize(out);                 // [rows, cols] f32
//   kernels::linear_quant(x, M, m.view(), bias, y);
//
// nf4 keeps its per-block scales twice: double-quantized (DoubleQuant, what files hold) and
// decoded to f32 (what the kernels read: one float per 64 weights).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/quant/formats.hpp>
#include <edl/quant/quantize.hpp>
#include <edl/quant/row_groups.hpp>

namespace edl::quant {

/// What a kernel needs of a quantized matrix.
struct MatrixView {
  Format format = Format::none;
  const std::uint8_t* data = nullptr;  // q8_0, q4_0: groups() groups of 16 rows; nf4: rows of blocks
  const float* absmax = nullptr;       // nf4: rows * cols / 64 block scales
  std::int64_t rows = 0, cols = 0;

  std::int64_t blocks_per_row() const noexcept { return cols / block_elems(format); }
  /// Bytes of a row in a file (GGUF's rows of blocks).
  std::int64_t row_bytes() const noexcept { return blocks_per_row() * block_bytes(format); }
  /// q8_0, q4_0: groups of kGroupRows rows, the last padded with zero rows.
  std::int64_t groups() const noexcept { return (rows + kGroupRows - 1) / kGroupRows; }
  const std::uint8_t* group(std::int64_t g) const noexcept { return data + g * group_bytes(format, blocks_per_row()); }
  /// nf4: row r's blocks and scales.
  const std::uint8_t* row(std::int64_t r) const noexcept { return data + r * row_bytes(); }
  const float* row_absmax(std::int64_t r) const noexcept { return absmax + r * blocks_per_row(); }

  /// Blocks [b0, b1) of row r in GGUF's layout at out (nf4: its codes).
  void copy_blocks(std::int64_t r, std::int64_t b0, std::int64_t b1, void* out) const noexcept {
    auto* o = static_cast<std::uint8_t*>(out);
    if (!in_row_groups(format)) {
      std::memcpy(o, row(r) + b0 * block_bytes(format), static_cast<std::size_t>((b1 - b0) * block_bytes(format)));
      return;
    }
    const std::uint8_t* g = group(r / kGroupRows);
    for (std::int64_t b = b0; b < b1; ++b, o += block_bytes(format))
      block_of(format, g, blocks_per_row(), static_cast<int>(r % kGroupRows), b, o);
  }
  /// Row r in GGUF's layout at out (row_bytes() bytes).
  void copy_row(std::int64_t r, void* out) const noexcept { copy_blocks(r, 0, blocks_per_row(), out); }
};

class Matrix {
 public:
  Matrix() = default;

  /// Checks that `cols` splits into whole blocks of `f`, naming `what` (the tensor) if not.
  static void check_shape(Format f, std::int64_t rows, std::int64_t cols, const std::string& what) {
    EDL_CHECK(f != Format::none, errc::invalid_argument, what, "no quantization format given");
    EDL_CHECK(rows > 0 && cols > 0 && cols % block_elems(f) == 0, errc::shape_mismatch, what, format_name(f),
              " stores rows in blocks of ", block_elems(f), " values: the row length must be a positive multiple of ",
              block_elems(f), ", found [", rows, ", ", cols, "]");
  }

  /// Quantizes w [rows, cols] (f32, row-major), rows in parallel.
  static Matrix quantize(Format f, const float* w, std::int64_t rows, std::int64_t cols, const std::string& what) {
    check_shape(f, rows, cols, what);
    Matrix m(f, rows, cols);
    const std::int64_t rb = m.view().row_bytes(), nb = cols / block_elems(f);
    std::vector<float> absmax;
    if (f == Format::nf4) {
      absmax.resize(static_cast<std::size_t>(rows * nb));
      for (std::int64_t i = 0; i < rows * nb; ++i) {
        float a = 0.f;
        for (std::int64_t k = 0; k < 64; ++k) a = std::max(a, std::fabs(w[i * 64 + k]));
        absmax[static_cast<std::size_t>(i)] = a;
      }
      m.dq_ = DoubleQuant::quantize(absmax);
      for (std::size_t i = 0; i < absmax.size(); ++i) m.absmax_[i] = m.dq_.value(i);
    }
    if (in_row_groups(f)) {
      exec::parallel_for(0, m.view().groups(), 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        std::vector<std::uint8_t> row(static_cast<std::size_t>(rb));
        for (std::int64_t r = lo * kGroupRows; r < std::min(rows, hi * kGroupRows); ++r) {
          if (f == Format::q8_0) quantize_row_q8_0(w + r * cols, reinterpret_cast<BlockQ8_0*>(row.data()), cols);
          else quantize_row_q4_0(w + r * cols, reinterpret_cast<BlockQ4_0*>(row.data()), cols);
          m.put_row(r, row.data());
        }
      });
      return m;
    }
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, 65536 / cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t r = lo; r < hi; ++r)
        quantize_row_nf4(w + r * cols, m.absmax_.data() + r * nb, reinterpret_cast<BlockNF4*>(m.bytes_.data() + r * rb), cols);
    });
    return m;
  }

  /// A matrix over the given bytes (a file's): rows * cols / block_elems(f) blocks, and for
  /// nf4 the double-quantized scales.
  static Matrix from_bytes(Format f, std::int64_t rows, std::int64_t cols, std::span<const std::uint8_t> bytes,
                           const DoubleQuant* dq, const std::string& what) {
    check_shape(f, rows, cols, what);
    Matrix m(f, rows, cols);
    EDL_CHECK(static_cast<std::int64_t>(bytes.size()) == rows * m.view().row_bytes(), errc::shape_mismatch, what,
              "expected ", rows * m.view().row_bytes(), " bytes of ", format_name(f), " blocks for [", rows, ", ", cols,
              "], found ", bytes.size());
    if (in_row_groups(f)) {
      const std::int64_t rb = m.view().row_bytes();
      exec::parallel_for(0, m.view().groups(), 1, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
        for (std::int64_t r = lo * kGroupRows; r < std::min(rows, hi * kGroupRows); ++r) m.put_row(r, bytes.data() + r * rb);
      });
      return m;
    }
    std::memcpy(m.bytes_.data(), bytes.data(), bytes.size());
    if (f == Format::nf4) {
      const std::size_t nblk = static_cast<std::size_t>(rows * (cols / 64));
      EDL_CHECK(dq && dq->codes.size() == nblk &&
                    dq->scales.size() == (nblk + DoubleQuant::group - 1) / DoubleQuant::group,
                errc::shape_mismatch, what, "nf4 needs ", nblk, " scale codes and ",
                (nblk + DoubleQuant::group - 1) / DoubleQuant::group, " group scales, found ",
                dq ? dq->codes.size() : 0, " and ", dq ? dq->scales.size() : 0);
      m.dq_ = *dq;
      for (std::size_t i = 0; i < nblk; ++i) m.absmax_[i] = m.dq_.value(i);
    }
    return m;
  }

  Format format() const noexcept { return format_; }
  bool empty() const noexcept { return format_ == Format::none; }
  std::int64_t rows() const noexcept { return rows_; }
  std::int64_t cols() const noexcept { return cols_; }
  /// The bytes as the kernels read them (q8_0, q4_0: in row groups).
  std::span<const std::uint8_t> bytes() const noexcept { return {bytes_.data(), bytes_.size()}; }
  /// The rows in GGUF's layout, as files hold them: rows * view().row_bytes() bytes.
  std::vector<std::uint8_t> file_bytes() const {
    const MatrixView v = view();
    std::vector<std::uint8_t> out(static_cast<std::size_t>(rows_ * v.row_bytes()));
    for (std::int64_t r = 0; r < rows_; ++r) v.copy_row(r, out.data() + r * v.row_bytes());
    return out;
  }
  const DoubleQuant& double_quant() const noexcept { return dq_; }
  /// Bytes the kernels read: blocks, plus nf4's f32 scales.
  std::int64_t storage_bytes() const noexcept {
    return static_cast<std::int64_t>(bytes_.size() + absmax_.size() * sizeof(float));
  }
  MatrixView view() const noexcept { return {format_, bytes_.data(), absmax_.data(), rows_, cols_}; }

  /// Rows [r0, r1) as a matrix of their own (a tp shard of a column-parallel weight); an nf4
  /// slice has no double_quant().
  Matrix slice_rows(std::int64_t r0, std::int64_t r1) const {
    Matrix m(format_, r1 - r0, cols_);
    const std::int64_t rb = view().row_bytes(), nb = view().blocks_per_row();
    if (in_row_groups(format_)) {
      std::vector<std::uint8_t> row(static_cast<std::size_t>(rb));
      for (std::int64_t r = r0; r < r1; ++r) {
        view().copy_row(r, row.data());
        m.put_row(r - r0, row.data());
      }
      return m;
    }
    std::memcpy(m.bytes_.data(), bytes_.data() + r0 * rb, static_cast<std::size_t>((r1 - r0) * rb));
    if (format_ == Format::nf4)  // a shard computes with the scales; files are written from the whole matrix
      std::memcpy(m.absmax_.data(), absmax_.data() + r0 * nb, static_cast<std::size_t>((r1 - r0) * nb) * sizeof(float));
    return m;
  }

  /// Columns [c0, c1) as a matrix of their own (a tp shard of a row-parallel weight): whole
  /// blocks only, so the bounds must fall on block edges (an error naming `what` otherwise).
  Matrix slice_cols(std::int64_t c0, std::int64_t c1, const std::string& what) const {
    const std::int64_t be = block_elems(format_), bb = block_bytes(format_);
    EDL_CHECK(0 <= c0 && c0 < c1 && c1 <= cols_ && c0 % be == 0 && c1 % be == 0, errc::not_divisible, what,
              "columns [", c0, ", ", c1, ") of a ", format_name(format_), " matrix must be whole blocks of ", be,
              " (", cols_, " columns in all)");
    Matrix m(format_, rows_, c1 - c0);
    const MatrixView v = view();
    const std::int64_t nb = v.blocks_per_row(), mb = (c1 - c0) / be;
    if (in_row_groups(format_)) {
      std::vector<std::uint8_t> row(static_cast<std::size_t>(mb * bb));
      for (std::int64_t r = 0; r < rows_; ++r) {
        v.copy_blocks(r, c0 / be, c1 / be, row.data());
        m.put_row(r, row.data());
      }
      return m;
    }
    for (std::int64_t r = 0; r < rows_; ++r) {
      std::memcpy(m.bytes_.data() + r * mb * bb, v.row(r) + c0 / be * bb, static_cast<std::size_t>(mb * bb));
      if (format_ == Format::nf4)
        std::memcpy(m.absmax_.data() + r * mb, absmax_.data() + r * nb + c0 / be, static_cast<std::size_t>(mb) * sizeof(float));
    }
    return m;
  }

  /// All rows dequantized into out [rows, cols].
  void dequantize(float* out) const {
    const MatrixView v = view();
    exec::parallel_for(0, rows_, std::max<std::int64_t>(1, 65536 / cols_), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) dequantize_row(v, r, out + r * cols_);
    });
  }

  static void dequantize_row(const MatrixView& v, std::int64_t r, float* out) {
    dequantize_blocks(v, r, 0, v.blocks_per_row(), out);
  }
  /// Blocks [b0, b1) of row r dequantized into out ((b1 - b0) * block_elems values).
  static void dequantize_blocks(const MatrixView& v, std::int64_t r, std::int64_t b0, std::int64_t b1, float* out) {
    const std::int64_t n = (b1 - b0) * block_elems(v.format);
    switch (v.format) {
      case Format::q8_0:
      case Format::q4_0: {
        for (std::int64_t b = b0; b < b1; ++b, out += 32) {
          alignas(8) std::uint8_t blk[sizeof(BlockQ8_0)];
          v.copy_blocks(r, b, b + 1, blk);
          if (v.format == Format::q8_0) dequantize_row_q8_0(reinterpret_cast<const BlockQ8_0*>(blk), out, 32);
          else dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(blk), out, 32);
        }
        break;
      }
      case Format::nf4:
        dequantize_row_nf4(reinterpret_cast<const BlockNF4*>(v.row(r)) + b0, v.row_absmax(r) + b0, out, n);
        break;
      case Format::none: break;
    }
  }

 private:
  Matrix(Format f, std::int64_t rows, std::int64_t cols) : format_(f), rows_(rows), cols_(cols) {
    const std::int64_t nb = cols / block_elems(f);
    if (in_row_groups(f)) bytes_.assign(static_cast<std::size_t>(view().groups() * group_bytes(f, nb)), 0);  // padding rows: zero
    else bytes_.resize(static_cast<std::size_t>(rows * nb * block_bytes(f)));
    if (f == Format::nf4) absmax_.resize(static_cast<std::size_t>(rows * (cols / 64)));
  }

  /// Row r (GGUF's layout) into its group.
  void put_row(std::int64_t r, const std::uint8_t* row) noexcept {
    const std::int64_t nb = view().blocks_per_row();
    put_group_row(format_, row, nb, static_cast<int>(r % kGroupRows), bytes_.data() + r / kGroupRows * group_bytes(format_, nb));
  }

  Format format_ = Format::none;
  std::int64_t rows_ = 0, cols_ = 0;
  aligned_vector<std::uint8_t> bytes_;
  aligned_vector<float> absmax_;  // nf4: the decoded block scales
  DoubleQuant dq_;                // nf4: the same scales, double-quantized
};

}  // namespace edl::quant
