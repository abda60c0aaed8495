// Tests for edl/generate/rope_table.hpp: rotating one token at a time from the table equals
// the full forward's rotary embedding of the whole sequence, with and without rope_scaling
// (the length-dependent scalings at the sequence's length, past their threshold).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include <edl/generate/rope_table.hpp>

namespace edl::generate {
namespace {

TEST(RopeTable, OneTokenAtATimeEqualsTheSequenceRotation) {
  for (const std::string kind : {"default", "llama3", "yarn", "dynamic", "longrope"}) {
    SCOPED_TRACE(kind);
    models::LlamaConfig c = models::LlamaConfig::preset("tiny");
    const std::int64_t P = 40, heads = 3, D = c.head_size();
    if (kind != "default") {
      c.rope_scaling = models::RopeScaling{};
      c.rope_scaling->rope_type = kind;
      c.rope_scaling->factor = 8.0;
      c.rope_scaling->low_freq_factor = 1.0;
      c.rope_scaling->high_freq_factor = 4.0;
      c.rope_scaling->original_max_position_embeddings = 16;
      c.rope_scaling->has_original_max = kind != "llama3";
      for (std::int64_t i = 0; i < D / 2; ++i) {
        c.rope_scaling->short_factor.push_back(1.0 + 0.1 * static_cast<double>(i));
        c.rope_scaling->long_factor.push_back(2.0 + static_cast<double>(i));
      }
      if (kind == "dynamic") c.max_position_embeddings = 16;
      c.validate();
    }
    std::mt19937 gen(7);
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<std::size_t>(P * heads * D));
    for (float& v : x) v = nd(gen);
    // Reference: the model's rotary embedding over positions 0..P-1 at once.
    nn::RotaryEmbedding rot(D, models::rope_config(c));
    std::vector<float> cos, sin, ref = x;
    rot.tables(nn::TokenLayout{1, P}, cos, sin);
    rot.apply(ref.data(), P, heads, cos.data(), sin.data());
    const RopeTable table(c, P);
    std::vector<float> got = x, cs(static_cast<std::size_t>(D));
    RopeTable::Scratch scratch;
    for (std::int64_t p = P - 1; p >= 0; --p) {  // any order
      table.angles(p, P, cs.data(), cs.data() + D / 2, scratch);
      table.rotate(got.data() + p * heads * D, heads, cs.data(), cs.data() + D / 2);
    }
    EXPECT_EQ(got, ref);
    // Position 0 is the identity (times yarn's and longrope's attention factor); later positions
    // move the vector.
    if (rot.scale() == 1.0) {
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + heads * D, x.begin()));
    }
    EXPECT_NE(got[static_cast<std::size_t>(5 * heads * D)], x[static_cast<std::size_t>(5 * heads * D)]);
    if (kind != "default") continue;
    // Without scaling: the closed form, angle = p / theta^(2i/D), in double.
    const std::int64_t half = D / 2;
    for (std::int64_t p = 0; p < P; ++p)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(p) / std::pow(c.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(D));
          const std::size_t o = static_cast<std::size_t>((p * heads + h) * D + i);
          const double x0 = x[o], x1 = x[o + static_cast<std::size_t>(half)];
          EXPECT_NEAR(got[o], x0 * std::cos(a) - x1 * std::sin(a), 1e-5) << p << " " << h << " " << i;
          EXPECT_NEAR(got[o + static_cast<std::size_t>(half)], x1 * std::cos(a) + x0 * std::sin(a), 1e-5);
        }
  }
}

}  // namespace
}  // namespace edl::generate
