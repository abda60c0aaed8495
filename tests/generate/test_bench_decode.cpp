// tests/generate/test_bench_decode.cpp: the read patterns `edl bench decode --bandwidth` and
// `--paired-bandwidth` time (examples/cli/generate.hpp) read every element they are given
// once and nothing else, and a paired read walks the buffer without rereading what it just read;
// the paired read of the weights reads the tensors a decode step reads, each float once.
#include <cstddef>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../../examples/cli/generate.hpp"
#include "small_llama.hpp"

namespace {

namespace gd = edl::cli::gen_detail;

// Every pattern's sum over `per` floats is the naive sum (small integers: exact in f32 in any
// order), and the huge element right after them is never read into it.
TEST(BenchDecode, EveryReadPatternSumsExactlyTheFloatsItIsGiven) {
  const std::size_t per = 2 * gd::kReadQuantum;
  std::vector<float> x(per + 1);
  double naive = 0;
  for (std::size_t i = 0; i < per; ++i) naive += (x[i] = static_cast<float>(i % 13) - 6.0f);
  x[per] = 1e30f;
  for (int p = 0; p < gd::kReadPatterns; ++p)
    EXPECT_EQ(static_cast<double>(gd::read_pattern(p, x.data(), per)), naive) << gd::kReadPatternNames[p];
}

// timed_read rounds a request to whole quanta per thread, reports what it read, moves the
// offset past it and starts over at the buffer's start when the next read would not fit.
TEST(BenchDecode, PairedReadsWalkTheBufferAndWrapAtItsEnd) {
  const int threads_before = edl::exec::num_threads();
  for (const int threads : {1, 2}) {
    edl::exec::set_num_threads(threads);
    const std::size_t q = gd::kReadQuantum, t = static_cast<std::size_t>(threads);
    edl::aligned_vector<float> buf;
    gd::ensure_read_buffer(buf, 5 * t * q * sizeof(float));
    ASSERT_EQ(buf.size(), 5 * t * q);
    std::size_t offset = 0, done = 0;
    EXPECT_GT(gd::timed_read(buf, 5, 2 * t * q, offset, done), 0.0);
    EXPECT_EQ(done, 2 * t * q);
    EXPECT_EQ(offset, 2 * t * q);
    gd::timed_read(buf, 0, 2 * t * q + 1, offset, done);  // rounds to the nearest whole quanta
    EXPECT_EQ(done, 2 * t * q);
    EXPECT_EQ(offset, 4 * t * q);
    gd::timed_read(buf, 2, 2 * t * q, offset, done);  // does not fit after 4: starts over
    EXPECT_EQ(offset, 2 * t * q);
    gd::timed_read(buf, 3, 1, offset, done);  // at least one quantum per thread
    EXPECT_EQ(done, t * q);
    EXPECT_EQ(offset, 3 * t * q);
    gd::timed_read(buf, 4, 12 * t * q, offset, done);  // more than the buffer: several passes
    EXPECT_EQ(done, 12 * t * q);
  }
  edl::exec::set_num_threads(threads_before);
}

}  // namespace

namespace {

// The paired read of the weights (--paired-bandwidth on one device) reads exactly the tensors
// a decode step reads: every parameter but the embedding table, which is read when it is the
// tied lm_head.
TEST(BenchDecode, WeightSpansAreTheParametersADecodeStepReads) {
  for (const std::string variant : {"", "tied", "bias"}) {
    edl::models::LlamaForCausalLM<> m(edl::generate::test_support::small_llama(50, 32, variant));
    m.init(edl::Key::from_seed(1));
    const auto spans = gd::decode_weight_spans(m);
    std::size_t bytes = 0;
    bool has_embedding = false;
    for (const auto& [data, n] : spans) {
      bytes += n;
      has_embedding |= data == reinterpret_cast<const char*>(m.model.embed_tokens.weight.data());
    }
    const std::int64_t emb = m.tied() ? 0 : m.config().vocab_size * m.config().hidden_size;
    EXPECT_EQ(bytes, static_cast<std::size_t>(m.param_count() - emb) * sizeof(float)) << variant;
    EXPECT_EQ(has_embedding, m.tied()) << variant;
    bool has_head = false;
    for (const auto& sp : spans) has_head |= sp.first == reinterpret_cast<const char*>(m.head_weight());
    EXPECT_TRUE(has_head) << variant;
  }
}

// Both weights-read patterns sum every float of every span once over the threads' parts, and
// nothing past a span's end (a huge float follows each one). Spans of odd lengths, and one long
// enough that each part holds whole blocks of the kernel's lockstep streams.
TEST(BenchDecode, WeightsReadPatternsSumEveryFloatOfEverySpanOnce) {
  const std::size_t block = static_cast<std::size_t>(edl::kernels::detail::kStreams * edl::kernels::detail::kStreamBytes) /
                            sizeof(float);
  std::vector<std::vector<float>> store;
  std::vector<std::pair<const char*, std::size_t>> spans;
  double naive = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{1000}, 2 * block + 4099, std::size_t{255}}) {
    auto& v = store.emplace_back(n + 1);
    for (std::size_t i = 0; i < n; ++i) naive += (v[i] = static_cast<float>(i % 7) - 3.0f);
    v[n] = 1e30f;
    spans.emplace_back(reinterpret_cast<const char*>(v.data()), n * sizeof(float));
  }
  for (const std::size_t parts : {std::size_t{1}, std::size_t{2}, std::size_t{3}})
    for (int pattern = 0; pattern < gd::kWeightsReadPatterns; ++pattern) {
      double total = 0;
      for (std::size_t p = 0; p < parts; ++p) total += gd::weights_read_sum(spans, pattern, p, parts);
      EXPECT_EQ(total, naive) << gd::kWeightsReadPatternNames[pattern] << ", " << parts << " parts";
    }
}

}  // namespace

// --dtype: the model a command runs holds the converted parameters. On weights that bf16 / f16
// hold exactly, greedy tokens equal the f32 model's (the kernels widen 16-bit weights exactly);
// quantized Linears and unmerged adapters are refused, not converted.
TEST(BenchDecode, ParamDtypeConvertsAfterLoading) {
  namespace m = edl::models;
  auto cfg = edl::generate::test_support::small_llama(96, 64, "no_eos");
  cfg.intermediate_size = 64;  // q8_0 blocks of 32 for the refusal below
  m::LlamaForCausalLM<> f(cfg);
  f.init(edl::Key::from_seed(4), 0.2f);
  edl::generate::GenerationConfig g;
  g.max_new_tokens = 12;
  g.do_sample = false;
  const std::vector<std::vector<std::int64_t>> prompt = {edl::generate::test_support::random_ids(5, cfg.vocab_size, 3)};
  for (const std::string dtype : {"bf16", "f16"}) {
    // f32 weights that the 16-bit type holds exactly.
    m::LlamaForCausalLM<> exact = dtype == "bf16" ? m::to_dtype<edl::DefaultPolicy>(m::to_dtype<edl::BF16ParamsPolicy>(f))
                                                  : m::to_dtype<edl::DefaultPolicy>(m::to_dtype<edl::F16ParamsPolicy>(f));
    const auto want = edl::generate::generate(exact, prompt, g).tokens;
    std::size_t bytes = 0;
    const auto got = gd::with_param_dtype(exact, dtype, false, "generate", [&](const auto& model) {
      bytes = sizeof(typename std::decay_t<decltype(model)>::T);
      return edl::generate::generate(model, prompt, g).tokens;
    });
    EXPECT_EQ(bytes, 2u) << dtype;
    EXPECT_EQ(got, want) << dtype;
  }
  m::LlamaForCausalLM<> q = m::to_dtype<edl::DefaultPolicy>(f);
  edl::nn::quantize(q, {edl::quant::Format::q8_0, 0, edl::nn::QuantizationConfig::kWithHeadPattern});
  EXPECT_THROW(gd::with_param_dtype(q, "bf16", false, "generate", [](const auto&) { return 0; }), edl::Error);
}
