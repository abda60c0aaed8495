// tests/kernels/test_quant_dot.cpp: the SIMD dot products of quantized blocks against their
// written-out definitions (kernels::reference), bit for bit, and against the f32 dot product
// of the dequantized values within the activations' rounding.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <edl/core/allocator.hpp>
#include <edl/kernels/quant_amx.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/quant/matrix.hpp>

using namespace edl;

namespace {
std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(QuantDot, ActivationsQuantizeAsTheReference) {
  for (const std::int64_t K : {32, 160, 2048}) {
    std::vector<float> x = normal_values(static_cast<std::size_t>(K), 5);
    if (K == 160) {
      for (int i = 32; i < 64; ++i) x[static_cast<std::size_t>(i)] = 0.f;  // a zero block
      x[64] = 127.f;                                                         // ties: d = 1
      for (int i = 65; i < 96; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i - 80) + 0.5f;
      for (int i = 96; i < 128; ++i) x[static_cast<std::size_t>(i)] *= 1e-4f;  // d a subnormal f16
      for (int i = 128; i < 160; ++i) x[static_cast<std::size_t>(i)] *= 1e7f;  // d past f16's range
    }
    const std::size_t nb = static_cast<std::size_t>(K / 32);
    std::vector<quant::BlockQ8_0> a(nb), b(nb);
    kernels::quantize_activations(x.data(), a.data(), K);
    quant::quantize_activations_ref(x.data(), b.data(), K);
    // In one go into the blocks the dot products read: the reference's blocks, prepared.
    std::vector<kernels::ActivationBlock> xa(nb), want(nb);
    kernels::quantize_activations(x.data(), xa.data(), K);
    for (std::size_t i = 0; i < nb; ++i) kernels::prepare_activation(b[i], want[i]);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].d, b[i].d) << "block " << i;
      for (int j = 0; j < 32; ++j) EXPECT_EQ(a[i].qs[j], b[i].qs[j]) << "block " << i << " value " << j;
      EXPECT_EQ(std::memcmp(xa[i].qs, want[i].qs, 32), 0) << "block " << i;
      EXPECT_EQ(xa[i].sum, want[i].sum) << "block " << i;
      EXPECT_EQ(xa[i].neg8_sum, -8 * want[i].sum) << "block " << i;
      EXPECT_EQ(xa[i].neg128_sum, -128 * want[i].sum) << "block " << i;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(xa[i].d), std::bit_cast<std::uint32_t>(want[i].d)) << "block " << i;
    }
  }
}

namespace {
/// Rows of a format's file layout quantized from w [rows, K], and the matrix over them.
struct Int8Matrix {
  std::vector<std::uint8_t> file;
  quant::Matrix matrix;
};
Int8Matrix int8_rows(quant::Format f, const std::vector<float>& w, std::int64_t rows, std::int64_t K, bool with_minus_128) {
  const std::int64_t rb = K / 32 * quant::block_bytes(f);
  Int8Matrix r;
  r.file.resize(static_cast<std::size_t>(rows * rb));
  for (std::int64_t i = 0; i < rows; ++i) {
    std::uint8_t* row = r.file.data() + i * rb;
    if (f == quant::Format::q8_0) quant::quantize_row_q8_0(w.data() + i * K, reinterpret_cast<quant::BlockQ8_0*>(row), K);
    else quant::quantize_row_q4_0(w.data() + i * K, reinterpret_cast<quant::BlockQ4_0*>(row), K);
  }
  // The one int8 value quantization never makes (a file may hold it).
  if (with_minus_128 && f == quant::Format::q8_0) reinterpret_cast<quant::BlockQ8_0*>(r.file.data())[0].qs[3] = -128;
  r.matrix = quant::Matrix::from_bytes(f, rows, K, r.file, nullptr, "W");
  return r;
}
float definition(quant::Format f, const std::uint8_t* row, const quant::BlockQ8_0* x, std::int64_t nb) {
  if (f == quant::Format::q8_0) return kernels::reference::dot_int8(reinterpret_cast<const quant::BlockQ8_0*>(row), x, nb);
  return kernels::reference::dot_int8(reinterpret_cast<const quant::BlockQ4_0*>(row), x, nb);
}
template <int MR>
void expect_group_equals_definition(const Int8Matrix& w, std::int64_t g, const std::vector<kernels::ActivationBlock>& xa,
                                    const std::vector<quant::BlockQ8_0>& xq, std::int64_t nb) {
  const quant::MatrixView v = w.matrix.view();
  alignas(64) float out[MR * 16];
  kernels::dot_group<MR>(v, g, xa.data(), nb, out);
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < 16; ++n) {
      const std::int64_t r = g * 16 + n;
      const float want = r < v.rows ? definition(v.format, w.file.data() + r * v.row_bytes(), xq.data() + m * nb, nb) : 0.f;
      EXPECT_EQ(out[m * 16 + n], want) << quant::format_name(v.format) << " K " << nb * 32 << " MR " << MR << " row " << r
                                       << " activation row " << m;
    }
}
}  // namespace

TEST(QuantDot, GroupDotsEqualTheirDefinition) {
  // 16 rows of a group by 1 to 4 activation rows: one, two, an odd and many blocks, a full
  // group and a padded one (its padding rows give 0).
  std::printf("quantized dot path: %s%s\n", kernels::quant_dot_path, kernels::amx_available() ? ", AMX tiles for prefill" : "");
  for (const std::int64_t K : {32, 64, 160, 4096})
    for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0}) {
      const std::int64_t nb = K / 32, rows = 23;
      const Int8Matrix w = int8_rows(f, normal_values(static_cast<std::size_t>(rows * K), 6), rows, K, K == 160);
      const std::vector<float> x = normal_values(static_cast<std::size_t>(4 * K), 7);
      std::vector<quant::BlockQ8_0> xq(static_cast<std::size_t>(4 * nb));
      std::vector<kernels::ActivationBlock> xa(xq.size());
      for (int m = 0; m < 4; ++m) {
        quant::quantize_activations_ref(x.data() + m * K, xq.data() + m * nb, K);
        kernels::quantize_activations(x.data() + m * K, xa.data() + m * nb, K);
      }
      for (std::int64_t g = 0; g < 2; ++g) {
        expect_group_equals_definition<1>(w, g, xa, xq, nb);
        expect_group_equals_definition<2>(w, g, xa, xq, nb);
        expect_group_equals_definition<3>(w, g, xa, xq, nb);
        expect_group_equals_definition<4>(w, g, xa, xq, nb);
      }
      // Against the dequantized values in double: the integer sums are exact, so only the f32
      // accumulation of the block terms differs.
      std::vector<float> wd(static_cast<std::size_t>(K)), xd(static_cast<std::size_t>(K));
      quant::dequantize_row_q8_0(xq.data(), xd.data(), K);
      if (f == quant::Format::q8_0) quant::dequantize_row_q8_0(reinterpret_cast<const quant::BlockQ8_0*>(w.file.data()), wd.data(), K);
      else quant::dequantize_row_q4_0(reinterpret_cast<const quant::BlockQ4_0*>(w.file.data()), wd.data(), K);
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(wd[static_cast<std::size_t>(k)]) * xd[static_cast<std::size_t>(k)];
        mag += std::fabs(static_cast<double>(wd[static_cast<std::size_t>(k)]) * xd[static_cast<std::size_t>(k)]);
      }
      alignas(64) float out[16];
      kernels::dot_group<1>(w.matrix.view(), 0, xa.data(), nb, out);
      EXPECT_NEAR(out[0], s, 1e-6 * mag + 1e-6) << K << " " << quant::format_name(f);
    }
}

// A group that ends where a page nobody may read begins: the dots read no byte past the
// group's scales (a byte beyond would fault here) and still equal their definition for every
// block count, odd and even.
TEST(QuantDot, GroupAtTheEndOfReadableMemory) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t span = 8 * page;
  void* map = mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<char*>(map) + span, page, PROT_NONE), 0);
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0})
    for (std::int64_t nb = 1; nb <= 12; ++nb) {
      const std::int64_t K = nb * 32;
      const Int8Matrix w = int8_rows(f, normal_values(static_cast<std::size_t>(16 * K), 11), 16, K, false);
      const std::size_t bytes = w.matrix.bytes().size();
      ASSERT_LE(bytes, span);
      std::uint8_t* at = static_cast<std::uint8_t*>(map) + span - bytes;
      std::memcpy(at, w.matrix.bytes().data(), bytes);
      quant::MatrixView v = w.matrix.view();
      v.data = at;
      const std::vector<float> x = normal_values(static_cast<std::size_t>(K), 12);
      std::vector<quant::BlockQ8_0> xq(static_cast<std::size_t>(nb));
      std::vector<kernels::ActivationBlock> xa(xq.size());
      quant::quantize_activations_ref(x.data(), xq.data(), K);
      kernels::quantize_activations(x.data(), xa.data(), K);
      alignas(64) float out[16];
      kernels::dot_group<1>(v, 0, xa.data(), nb, out);
      for (int n = 0; n < 16; ++n)
        EXPECT_EQ(out[n], definition(f, w.file.data() + n * v.row_bytes(), xq.data(), nb)) << nb << " blocks, row " << n;
    }
  munmap(map, span + page);
}

TEST(QuantDot, Nf4DotEqualsItsDefinition) {
  for (const std::int64_t K : {64, 640}) {
    const std::int64_t nb = K / 64;
    const std::vector<float> w = normal_values(static_cast<std::size_t>(K), 8), x = normal_values(static_cast<std::size_t>(K), 9);
    std::vector<float> absmax(static_cast<std::size_t>(nb));
    for (std::int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < 64; ++i) absmax[static_cast<std::size_t>(b)] = std::max(absmax[static_cast<std::size_t>(b)], std::fabs(w[static_cast<std::size_t>(b * 64 + i)]));
    std::vector<quant::BlockNF4> q(static_cast<std::size_t>(nb));
    quant::quantize_row_nf4(w.data(), absmax.data(), q.data(), K);
    const float got = kernels::dot_nf4(q.data(), absmax.data(), x.data(), nb);
    EXPECT_EQ(got, (kernels::reference::dot_nf4<kernels::kNF4Lanes>(q.data(), absmax.data(), x.data(), nb))) << K;
    std::vector<float> wd(static_cast<std::size_t>(K));
    quant::dequantize_row_nf4(q.data(), absmax.data(), wd.data(), K);
    double s = 0, mag = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      s += static_cast<double>(wd[static_cast<std::size_t>(k)]) * x[static_cast<std::size_t>(k)];
      mag += std::fabs(static_cast<double>(wd[static_cast<std::size_t>(k)]) * x[static_cast<std::size_t>(k)]);
    }
    EXPECT_NEAR(got, s, 1e-5 * mag) << K;
  }
}
