// edl/quant/matrix.hpp
// A quantized weight matrix [rows, cols] (a Linear's weight, HF layout [out, in]): each row is
// cols / block_elems(format) blocks, rows one after another, the bytes on cache lines as the
// f32 weights are (decode streams them once per token).
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

namespace edl::quant {

/// What a kernel needs of a quantized matrix.
struct MatrixView {
  Format format = Format::none;
  const std::uint8_t* data = nullptr;  // rows * row_bytes
  const float* absmax = nullptr;       // nf4: rows * cols / 64 block scales
  std::int64_t rows = 0, cols = 0;

  std::int64_t blocks_per_row() const noexcept { return cols / block_elems(format); }
  std::int64_t row_bytes() const noexcept { return blocks_per_row() * block_bytes(format); }
  const std::uint8_t* row(std::int64_t r) const noexcept { return data + r * row_bytes(); }
  const float* row_absmax(std::int64_t r) const noexcept { return absmax + r * blocks_per_row(); }
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
    exec::parallel_for(0, rows, std::max<std::int64_t>(1, 65536 / cols), [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        std::uint8_t* dst = m.bytes_.data() + r * rb;
        const float* src = w + r * cols;
        switch (f) {
          case Format::q8_0: quantize_row_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), cols); break;
          case Format::q4_0: quantize_row_q4_0(src, reinterpret_cast<BlockQ4_0*>(dst), cols); break;
          case Format::nf4: quantize_row_nf4(src, m.absmax_.data() + r * nb, reinterpret_cast<BlockNF4*>(dst), cols); break;
          case Format::none: break;
        }
      }
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
  std::span<const std::uint8_t> bytes() const noexcept { return {bytes_.data(), bytes_.size()}; }
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
    switch (v.format) {
      case Format::q8_0: dequantize_row_q8_0(reinterpret_cast<const BlockQ8_0*>(v.row(r)), out, v.cols); break;
      case Format::q4_0: dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(v.row(r)), out, v.cols); break;
      case Format::nf4:
        dequantize_row_nf4(reinterpret_cast<const BlockNF4*>(v.row(r)), v.row_absmax(r), out, v.cols);
        break;
      case Format::none: break;
    }
  }

 private:
  Matrix(Format f, std::int64_t rows, std::int64_t cols) : format_(f), rows_(rows), cols_(cols) {
    bytes_.resize(static_cast<std::size_t>(rows * (cols / block_elems(f)) * block_bytes(f)));
    if (f == Format::nf4) absmax_.resize(static_cast<std::size_t>(rows * (cols / 64)));
  }

  Format format_ = Format::none;
  std::int64_t rows_ = 0, cols_ = 0;
  aligned_vector<std::uint8_t> bytes_;
  aligned_vector<float> absmax_;  // nf4: the decoded block scales
  DoubleQuant dq_;                // nf4: the same scales, double-quantized
};

}  // namespace edl::quant
