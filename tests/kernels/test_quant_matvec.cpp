// tests/kernels/test_quant_matvec.cpp: products with quantized matrices. int8 formats: every
// output equals the definition's dot product of its weight row with the quantized activation
// row, for any number of rows; nf4: decode's rows equal its dots, prefill's GEMM the f32 GEMM
// of the dequantized matrix bit for bit (dequantized values are exact in f32); the input
// gradient likewise; and the same bits on 1 and 2 threads. Also quant::Matrix's row groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <edl/core/exec.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/matvec.hpp>
#include <edl/kernels/quant_matvec.hpp>

using namespace edl;

namespace {
std::vector<float> normal_values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
/// The definition's dot of int8 row j of v (taken out of its group in GGUF's layout) with xq.
float int8_row_definition(const quant::MatrixView& v, std::int64_t j, const quant::BlockQ8_0* xq) {
  std::vector<std::uint8_t> row(static_cast<std::size_t>(v.row_bytes()));
  v.copy_row(j, row.data());
  if (v.format == quant::Format::q8_0)
    return kernels::reference::dot_int8(reinterpret_cast<const quant::BlockQ8_0*>(row.data()), xq, v.blocks_per_row());
  return kernels::reference::dot_int8(reinterpret_cast<const quant::BlockQ4_0*>(row.data()), xq, v.blocks_per_row());
}
}  // namespace

TEST(QuantMatvec, LinearEqualsRowDotsAndTheDequantizedGemm) {
  // int8 formats: every row count (decode's rows, prefill's tiles and their edges, an even and
  // an odd number of blocks) gives the dot products of the definition. nf4: decode rows give
  // its dots, more rows the dequantized matrix's GEMM.
  const std::int64_t N = 37;
  std::vector<float> bias = normal_values(static_cast<std::size_t>(N), 12);
  for (const std::int64_t K : {192, 224})
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0, quant::Format::nf4}) {
    if (K % quant::block_elems(f) != 0) continue;
    const std::vector<float> w = normal_values(static_cast<std::size_t>(N * K), 11);
    const quant::Matrix W = quant::Matrix::quantize(f, w.data(), N, K, "W");
    const quant::MatrixView v = W.view();
    std::vector<float> wd(static_cast<std::size_t>(N * K));
    W.dequantize(wd.data());
    for (const std::int64_t M : {1, 3, 16, 17, 40, 131}) {
      const std::vector<float> x = normal_values(static_cast<std::size_t>(M * K), 13 + static_cast<unsigned>(M));
      std::vector<float> y(static_cast<std::size_t>(M * N)), want(y.size());
      const int threads_before = exec::num_threads();
      std::vector<float> first;
      for (const int threads : {1, 2}) {
        exec::set_num_threads(threads);
        kernels::linear_quant(x.data(), M, v, bias.data(), y.data());
        if (first.empty()) first = y;
        EXPECT_EQ(y, first) << quant::format_name(f) << " M " << M << " threads " << threads;
      }
      exec::set_num_threads(threads_before);
      if (M <= 16 || f != quant::Format::nf4) {
        std::vector<quant::BlockQ8_0> xq(static_cast<std::size_t>(K / 32));
        for (std::int64_t m = 0; m < M; ++m) {
          const float* xr = x.data() + m * K;
          quant::quantize_activations_ref(xr, xq.data(), K);
          for (std::int64_t j = 0; j < N; ++j) {
            const float s = f == quant::Format::nf4
                                ? kernels::reference::dot_nf4<kernels::kNF4Lanes>(
                                      reinterpret_cast<const quant::BlockNF4*>(v.row(j)), v.row_absmax(j), xr, K / 64)
                                : int8_row_definition(v, j, xq.data());
            want[static_cast<std::size_t>(m * N + j)] = s + bias[static_cast<std::size_t>(j)];
          }
        }
      } else {
        matmul_nt(x.data(), wd.data(), want.data(), M, N, K);
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t j = 0; j < N; ++j) want[static_cast<std::size_t>(m * N + j)] += bias[static_cast<std::size_t>(j)];
      }
      EXPECT_EQ(y, want) << quant::format_name(f) << " M " << M << " K " << K;
    }
    // The input gradient dx = dy W against the dequantized matrix.
    const std::int64_t M = 23;
    const std::vector<float> dy = normal_values(static_cast<std::size_t>(M * N), 21);
    std::vector<float> dx(static_cast<std::size_t>(M * K)), want(dx.size());
    kernels::matmul_dequantized(dy.data(), M, v, dx.data());
    matmul(dy.data(), wd.data(), want.data(), M, K, N);
    EXPECT_EQ(dx, want) << quant::format_name(f);
  }
}

TEST(QuantMatvec, AGroupOfProductsEqualsEachProductAlone) {
  // q, k and v (or gate and up) of one x share its quantized rows and one parallel region:
  // each output is still the product alone, bit for bit, for decode's and prefill's row counts,
  // parts of different widths (a chunk of rows crosses no part), a bias on one part only, and
  // an nf4 part among int8 ones.
  const std::int64_t K = 128;  // whole blocks of every format (nf4's are 64 long)
  const std::vector<std::int64_t> widths = {37, 16, 50};
  for (const quant::Format last : {quant::Format::q4_0, quant::Format::nf4}) {
    ASSERT_EQ(K % quant::block_elems(last), 0);
    std::vector<quant::Matrix> W;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      const quant::Format f = i == 0 ? quant::Format::q8_0 : i == 1 ? quant::Format::q4_0 : last;
      const std::vector<float> w = normal_values(static_cast<std::size_t>(widths[i] * K), 21 + static_cast<unsigned>(i));
      W.push_back(quant::Matrix::quantize(f, w.data(), widths[i], K, "W"));
    }
    const std::vector<float> bias = normal_values(static_cast<std::size_t>(widths[1]), 24);
    for (const std::int64_t M : {2, 17, 70}) {
      const std::vector<float> x = normal_values(static_cast<std::size_t>(M * K), 25 + static_cast<unsigned>(M));
      std::vector<std::vector<float>> alone(3), grouped(3);
      std::array<kernels::MatvecPart<float>, 3> parts;
      for (std::size_t i = 0; i < 3; ++i) {
        const float* b = i == 1 ? bias.data() : nullptr;
        alone[i].assign(static_cast<std::size_t>(M * widths[i]), 0.f);
        grouped[i].assign(alone[i].size(), -1.f);
        kernels::linear_quant(x.data(), M, W[i].view(), b, alone[i].data());
        parts[i] = kernels::MatvecPart<float>{nullptr, b, grouped[i].data(), widths[i], W[i].view()};
      }
      for (const int threads : {1, 2}) {
        const int threads_before = exec::num_threads();
        exec::set_num_threads(threads);
        kernels::linear_group<float, 3>(x.data(), M, parts, K);
        exec::set_num_threads(threads_before);
        for (std::size_t i = 0; i < 3; ++i)
          EXPECT_EQ(grouped[i], alone[i]) << "part " << i << " M " << M << " threads " << threads << " last part "
                                          << quant::format_name(last);
      }
    }
  }
}

TEST(QuantMatvec, RowRangesEqualTheRowDots) {
  // quant_matvec_rows (decode's products) over ranges that start and end anywhere, in a group
  // of 16 rows or across two (the second padded): each row's dot, plus its bias, and no row
  // outside the range written.
  const std::int64_t N = 23, K = 96;
  const std::vector<float> w = normal_values(static_cast<std::size_t>(N * K), 31), x = normal_values(static_cast<std::size_t>(K), 32);
  const std::vector<float> bias = normal_values(static_cast<std::size_t>(N), 33);
  std::vector<quant::BlockQ8_0> xq(static_cast<std::size_t>(K / 32));
  std::vector<kernels::ActivationBlock> xa(xq.size());
  quant::quantize_activations_ref(x.data(), xq.data(), K);
  for (std::size_t b = 0; b < xq.size(); ++b) kernels::prepare_activation(xq[b], xa[b]);
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0}) {
    const quant::Matrix W = quant::Matrix::quantize(f, w.data(), N, K, "W");
    for (const auto [lo, hi] : {std::pair<std::int64_t, std::int64_t>{0, N}, {3, 20}, {5, 6}, {8, 12}, {16, 23}, {0, 16}}) {
      std::vector<float> y(static_cast<std::size_t>(N), -1.f);
      kernels::quant_matvec_rows(W.view(), x.data(), xa.data(), bias.data(), y.data(), lo, hi);
      for (std::int64_t j = 0; j < N; ++j) {
        const float want = int8_row_definition(W.view(), j, xq.data()) + bias[static_cast<std::size_t>(j)];
        EXPECT_EQ(y[static_cast<std::size_t>(j)], j >= lo && j < hi ? want : -1.f) << quant::format_name(f) << " row " << j;
      }
    }
  }
}

TEST(QuantMatrix, RejectsRowsThatDoNotSplitIntoBlocks) {
  std::vector<float> w(3 * 48, 1.f);
  try {
    (void)quant::Matrix::quantize(quant::Format::q8_0, w.data(), 3, 48, "model.layers.0.mlp.up_proj.weight");
    FAIL() << "expected an edl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

TEST(QuantMatrix, RowGroupsHoldTheFileRows) {
  // q8_0 and q4_0 lie in groups of 16 rows: the file's rows come back out of them exactly
  // (whole, block by block, and through a file round trip), slices equal the matrices quantized
  // from the sliced weights, and dequantizing reads the right values.
  for (const quant::Format f : {quant::Format::q8_0, quant::Format::q4_0})
    for (const std::int64_t N : {1, 16, 23, 40}) {
      const std::int64_t K = 96, rb = K / 32 * quant::block_bytes(f);
      const std::vector<float> w = normal_values(static_cast<std::size_t>(N * K), 41 + static_cast<unsigned>(N));
      std::vector<std::uint8_t> file(static_cast<std::size_t>(N * rb));
      for (std::int64_t r = 0; r < N; ++r) {
        if (f == quant::Format::q8_0)
          quant::quantize_row_q8_0(w.data() + r * K, reinterpret_cast<quant::BlockQ8_0*>(file.data() + r * rb), K);
        else
          quant::quantize_row_q4_0(w.data() + r * K, reinterpret_cast<quant::BlockQ4_0*>(file.data() + r * rb), K);
      }
      const quant::Matrix W = quant::Matrix::quantize(f, w.data(), N, K, "W");
      EXPECT_EQ(W.file_bytes(), file) << quant::format_name(f) << " rows " << N;
      EXPECT_EQ(static_cast<std::int64_t>(W.bytes().size()), W.view().groups() * quant::group_bytes(f, K / 32));
      const quant::Matrix back = quant::Matrix::from_bytes(f, N, K, file, nullptr, "W");
      EXPECT_TRUE(std::equal(back.bytes().begin(), back.bytes().end(), W.bytes().begin(), W.bytes().end()));
      std::vector<std::uint8_t> blk(static_cast<std::size_t>(quant::block_bytes(f)));
      W.view().copy_blocks(N - 1, 2, 3, blk.data());
      EXPECT_EQ(std::memcmp(blk.data(), file.data() + (N - 1) * rb + 2 * quant::block_bytes(f), blk.size()), 0);
      std::vector<float> deq(static_cast<std::size_t>(N * K)), want(deq.size());
      W.dequantize(deq.data());
      for (std::int64_t r = 0; r < N; ++r) {
        if (f == quant::Format::q8_0)
          quant::dequantize_row_q8_0(reinterpret_cast<const quant::BlockQ8_0*>(file.data() + r * rb), want.data() + r * K, K);
        else
          quant::dequantize_row_q4_0(reinterpret_cast<const quant::BlockQ4_0*>(file.data() + r * rb), want.data() + r * K, K);
      }
      EXPECT_EQ(deq, want);
      if (N < 3) continue;
      const quant::Matrix rows = W.slice_rows(1, N - 1), cols = W.slice_cols(32, 96, "W");
      std::vector<float> wr(w.begin() + K, w.begin() + (N - 1) * K), wc;
      for (std::int64_t r = 0; r < N; ++r) wc.insert(wc.end(), w.begin() + r * K + 32, w.begin() + r * K + 96);
      const quant::Matrix rows_want = quant::Matrix::quantize(f, wr.data(), N - 2, K, "W");
      const quant::Matrix cols_want = quant::Matrix::quantize(f, wc.data(), N, 64, "W");
      EXPECT_TRUE(std::equal(rows.bytes().begin(), rows.bytes().end(), rows_want.bytes().begin(), rows_want.bytes().end()));
      EXPECT_TRUE(std::equal(cols.bytes().begin(), cols.bytes().end(), cols_want.bytes().begin(), cols_want.bytes().end()));
    }
}
