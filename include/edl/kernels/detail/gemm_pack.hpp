// edl/kernels/detail/gemm_pack.hpp
// Packing of GEMM operands into the micro-kernel's layouts, widening bf16 and f16 to f32 on the way.
//
//   A block (mc x kc of op(A)) -> ceil(mc/MR) micro-panels, each kc x MR (Ap[k*MR + r]).
//   B block (kc x nc of op(B)) -> ceil(nc/NR) micro-panels, each kc x NR (Bp[k*NR + c]).
// Rows / columns past the matrix edge are packed as zeros, so the micro-kernel never
// branches on edges. A quantized B (quant::MatrixView) is dequantized while it is packed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include <edl/core/allocator.hpp>
#include <edl/core/dtype.hpp>
#include <edl/kernels/detail/gemm_microkernel.hpp>
#include <edl/quant/matrix.hpp>

namespace edl::detail::gemm {

/// Grow-only float buffer on a cache line (edl::kCacheLineBytes; thread-local packing storage).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  float* get(std::size_t n) {
    if (n > cap_) {
      release();
      // Round up to 4 KiB so slowly growing requests do not reallocate every time.
      const std::size_t bytes = ((n * sizeof(float) + 4095) / 4096) * 4096;
      p_ = static_cast<float*>(::operator new(bytes, std::align_val_t(kCacheLineBytes)));
      cap_ = bytes / sizeof(float);
    }
    return p_;
  }

 private:
  void release() noexcept {
    if (p_) ::operator delete(p_, std::align_val_t(kCacheLineBytes));
    p_ = nullptr;
    cap_ = 0;
  }
  float* p_ = nullptr;
  std::size_t cap_ = 0;
};

/// The element types the GEMM reads (widened to f32 as they are packed).
template <class T>
inline constexpr bool storage = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// Widens n contiguous elements to f32 (auto-vectorised for bf16: a 16-bit shift).
template <class T>
inline void widen(const T* __restrict src, float* __restrict dst, std::int64_t n) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
  } else if constexpr (std::is_same_v<T, bf16>) {
    const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(src);
    std::uint32_t* d = reinterpret_cast<std::uint32_t*>(dst);
    for (std::int64_t i = 0; i < n; ++i) d[i] = static_cast<std::uint32_t>(s[i]) << 16;
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]);
  }
}

/// Packs rows [i0, i0+mc) x cols [k0, k0+kc) of op(A) (A row-major, leading dim lda).
/// trans == false: op(A)(i,k) = A[i*lda + k]; trans == true: op(A)(i,k) = A[k*lda + i].
template <class T>
void pack_a(bool trans, const T* A, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
            std::int64_t kc, float* __restrict dst) {
  for (std::int64_t p = 0; p < mc; p += MR) {
    const int mr = static_cast<int>(std::min<std::int64_t>(MR, mc - p));
    float* d = dst + p * kc;
    if (!trans) {
      const T* rows[MR];
      for (int r = 0; r < MR; ++r) rows[r] = A + (i0 + p + std::min(r, mr - 1)) * lda + k0;
      if (mr == MR) {
        for (std::int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) d[k * MR + r] = to_f32(rows[r][k]);
      } else {
        for (std::int64_t k = 0; k < kc; ++k)
          for (int r = 0; r < MR; ++r) d[k * MR + r] = r < mr ? to_f32(rows[r][k]) : 0.f;
      }
    } else {
      const T* src = A + k0 * lda + i0 + p;
      if (mr == MR) {
        for (std::int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) d[k * MR + r] = to_f32(src[k * lda + r]);
      } else {
        for (std::int64_t k = 0; k < kc; ++k)
          for (int r = 0; r < MR; ++r) d[k * MR + r] = r < mr ? to_f32(src[k * lda + r]) : 0.f;
      }
    }
  }
}

/// Packs micro-panels [q0, q1) (NR columns each) of the block rows [k0, k0+kc) x cols
/// [j0, j0+nc) of op(B) (B row-major, leading dim ldb).
/// trans == false: op(B)(k,j) = B[k*ldb + j]; trans == true: op(B)(k,j) = B[j*ldb + k].
template <class T>
void pack_b(bool trans, const T* B, std::int64_t ldb, std::int64_t k0, std::int64_t kc, std::int64_t j0,
            std::int64_t nc, std::int64_t q0, std::int64_t q1, float* __restrict dst) {
  for (std::int64_t q = q0; q < q1; ++q) {
    const std::int64_t jj = q * NR;
    const int nr = static_cast<int>(std::min<std::int64_t>(NR, nc - jj));
    float* d = dst + jj * kc;
    if (!trans) {
      const T* src = B + k0 * ldb + j0 + jj;
      if (nr == NR) {
        for (std::int64_t k = 0; k < kc; ++k) widen(src + k * ldb, d + k * NR, NR);
      } else {
        for (std::int64_t k = 0; k < kc; ++k) {
          widen(src + k * ldb, d + k * NR, nr);
          for (int c = nr; c < NR; ++c) d[k * NR + c] = 0.f;
        }
      }
    } else {
      // Transposing gather: column c of the panel is row (j0+jj+c) of B, contiguous in k.
      const T* src = B + (j0 + jj) * ldb + k0;
      constexpr std::int64_t KB = 64;  // k sub-block keeps the NR source rows' lines hot
      for (std::int64_t kb = 0; kb < kc; kb += KB) {
        const std::int64_t ke = std::min(kc, kb + KB);
        for (int c = 0; c < NR; ++c) {
          if (c < nr) {
            const T* s = src + c * ldb;
            for (std::int64_t k = kb; k < ke; ++k) d[k * NR + c] = to_f32(s[k]);
          } else {
            for (std::int64_t k = kb; k < ke; ++k) d[k * NR + c] = 0.f;
          }
        }
      }
    }
  }
}


/// pack_b for a quantized matrix W [rows, cols]: trans == true packs op(B) = W^T (y = x W^T),
/// trans == false op(B) = W (dx = dy W). Blocks are dequantized whole into a row buffer.
inline void pack_b(bool trans, const quant::MatrixView* Wp, std::int64_t /*ldb*/, std::int64_t k0, std::int64_t kc,
                   std::int64_t j0, std::int64_t nc, std::int64_t q0, std::int64_t q1, float* __restrict dst) {
  const quant::MatrixView& W = *Wp;
  const std::int64_t be = quant::block_elems(W.format);
  static thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(W.cols));
  // Dequantizes the blocks of row r covering columns [c0, c1) into row[c0 ..].
  const auto dequant = [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
    const std::int64_t b0 = c0 / be, b1 = (c1 + be - 1) / be;
    quant::Matrix::dequantize_blocks(W, r, b0, b1, row.data() + b0 * be);
  };
  for (std::int64_t q = q0; q < q1; ++q) {
    const std::int64_t jj = q * NR;
    const int nr = static_cast<int>(std::min<std::int64_t>(NR, nc - jj));
    float* d = dst + jj * kc;
    if (trans) {  // column c of the panel is row j0 + jj + c of W, over [k0, k0 + kc)
      for (int c = 0; c < NR; ++c) {
        if (c < nr) {
          dequant(j0 + jj + c, k0, k0 + kc);
          for (std::int64_t k = 0; k < kc; ++k) d[k * NR + c] = row[static_cast<std::size_t>(k0 + k)];
        } else {
          for (std::int64_t k = 0; k < kc; ++k) d[k * NR + c] = 0.f;
        }
      }
    } else {  // row k of the panel is columns [j0 + jj, + nr) of W's row k0 + k
      for (std::int64_t k = 0; k < kc; ++k) {
        dequant(k0 + k, j0 + jj, j0 + jj + nr);
        for (int c = 0; c < NR; ++c) d[k * NR + c] = c < nr ? row[static_cast<std::size_t>(j0 + jj + c)] : 0.f;
      }
    }
  }
}

}  // namespace edl::detail::gemm
