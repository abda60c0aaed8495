// Tests for edl/tensor/sharded_tensor.hpp and shard_layout.hpp: shard-then-gather is the
// identity for every spec on every mesh shape, blocks sit where JAX puts them, memory is
// accounted per device, and bad specs fail with errors that name the tensor.
#include <gtest/gtest.h>

#include <numeric>

#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>

namespace edl {
namespace {

const std::vector<std::array<std::int64_t, 4>> kMeshShapes = {
    {1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2}, {2, 2, 2, 1}, {1, 4, 2, 1}};

xt::xarray<float> iota_array(std::vector<std::size_t> shape) {
  xt::xarray<float> x = xt::xarray<float>::from_shape(shape);
  std::iota(x.begin(), x.end(), 0.0f);
  return x;
}

// Every spec of a rank-3 tensor: each mesh axis goes to no dimension or to one of the three,
// in mesh order or reversed within a dimension.
std::vector<SpecValue> all_specs(const MeshShape& mesh) {
  std::vector<SpecValue> specs;
  const std::size_t n = mesh.rank();
  std::size_t combos = 1;
  for (std::size_t i = 0; i < n; ++i) combos *= 4;
  for (std::size_t c = 0; c < combos; ++c)
    for (bool reversed : {false, true}) {
      SpecValue s{std::vector<std::vector<std::string>>(3)};
      std::size_t code = c;
      for (std::size_t a = 0; a < n; ++a, code /= 4) {
        const std::size_t axis = reversed ? n - 1 - a : a;
        const std::size_t dim = (reversed ? (c >> (2 * axis)) : code) % 4;
        if (dim > 0) s.dims[dim - 1].push_back(mesh.names()[axis]);
      }
      specs.push_back(s);
    }
  return specs;
}

TEST(ShardedArray, ShardThenGatherIsIdentityForEverySpecOnEveryMesh) {
  const auto x = iota_array({16, 8, 16});
  for (const auto& dims : kMeshShapes) {
    auto mesh = create_mesh(dims);
    std::size_t checked = 0;
    for (const auto& spec : all_specs(mesh.shape())) {
      auto s = shard(x, spec, mesh);
      ASSERT_EQ(gather(s), x) << spec.str() << " on " << mesh.shape().axes_str();
      // Every element is held by exactly devices / (product of the spec's axis sizes) devices.
      std::int64_t used = 1;
      for (std::size_t i = 0; i < 3; ++i) used *= spec.splits(i, mesh.shape());
      std::vector<std::int64_t> holders(x.size(), 0);  // x holds 0, 1, 2, ...: values are indices
      for (std::int64_t d = 0; d < mesh.size(); ++d)
        for (float v : s.local(d)) ++holders[static_cast<std::size_t>(v)];
      for (std::int64_t count : holders) ASSERT_EQ(count, mesh.size() / used) << spec.str();
      ++checked;
    }
    EXPECT_GT(checked, 100u);
  }
}

TEST(ShardedArray, FromIndexEqualsShardingTheWholeTensor) {
  // value(i) = i: every stored element must be the element of the whole tensor at its place.
  const auto x = iota_array({16, 8, 16});
  const auto by_index = [](std::uint64_t first, std::span<float> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(first + j);
  };
  for (const auto& dims : kMeshShapes) {
    auto mesh = create_mesh(dims);
    for (const auto& spec : all_specs(mesh.shape())) {
      const ShardLayout layout(mesh.shape(), spec, {16, 8, 16}, "x");
      const auto s = sharded_from_index<float>(layout, mesh.context(), by_index);
      const auto want = shard(x, spec, mesh);
      for (std::int64_t d = 0; d < mesh.size(); ++d) {
        ASSERT_TRUE(s.has_block(d));
        ASSERT_EQ(s.local(d), want.local(d)) << spec.str() << " on " << mesh.shape().axes_str() << ", device " << d;
      }
    }
  }
  // Storage dtypes round from f32; a vector and a placed layout keep their shapes.
  auto mesh = create_mesh({1, 2, 2, 1});
  const ShardLayout v(mesh.shape(), SpecValue{{{"tp"}}}, {6}, "v");
  const auto b = sharded_from_index<bf16>(v, mesh.context(), [](std::uint64_t first, std::span<float> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = 1.0f + static_cast<float>(first + j) / 3.0f;
  });
  for (std::int64_t d = 0; d < mesh.size(); ++d)
    for (std::size_t j = 0; j < 3; ++j) {
      const std::int64_t i = v.offset(d)[0] + static_cast<std::int64_t>(j);
      EXPECT_EQ(to_f32(b.local(d)(j)), to_f32(from_f32<bf16>(1.0f + static_cast<float>(i) / 3.0f)));
    }
}

TEST(ShardedTensor, TypedShardThenGatherIsIdentityOnEveryMesh) {
  xt::xtensor<float, 3> x = xt::xtensor<float, 3>::from_shape({16, 8, 16});
  std::iota(x.begin(), x.end(), 1.0f);
  for (const auto& dims : kMeshShapes) {
    auto mesh = create_mesh(dims);
    EXPECT_EQ(gather(shard<P<axes("dp", "fsdp"), none, "tp">>(x, mesh)), x);
    EXPECT_EQ(gather(shard<P<"tp", "sp", "fsdp">>(x, mesh)), x);
    EXPECT_EQ(gather(shard<P<none, none, axes("tp", "fsdp", "dp")>>(x, mesh)), x);
    EXPECT_EQ(gather(shard<P<none, none, none>>(x, mesh)), x);
  }
}

TEST(ShardedTensor, BlocksSitWhereJaxPutsThem) {
  // (dp=2, tp=2): P("tp", None) over (8, 6): devices with tp=0 hold rows 0-3, tp=1 rows 4-7.
  auto mesh = create_mesh({2, 1, 2, 1});
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({8, 6});
  std::iota(x.begin(), x.end(), 0.0f);
  auto s = shard<P<"tp", none>>(x, mesh);
  for (std::int64_t d = 0; d < 4; ++d) {
    const std::size_t tp = static_cast<std::size_t>(d % 2);
    ASSERT_EQ(s.local(d).shape(0), 4u);
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t c = 0; c < 6; ++c) EXPECT_EQ(s.local(d)(r, c), x(tp * 4 + r, c));
  }
  // P(("dp", "tp")) over 8 rows: block = dp * 2 + tp, the major axis first.
  auto t = shard<P<axes("dp", "tp"), none>>(x, mesh);
  for (std::int64_t d = 0; d < 4; ++d) {
    const std::size_t dp = static_cast<std::size_t>(d / 2), tp = static_cast<std::size_t>(d % 2);
    EXPECT_EQ(t.local(d)(0, 0), x((dp * 2 + tp) * 2, 0));
  }
  auto u = shard<P<axes("tp", "dp"), none>>(x, mesh);
  for (std::int64_t d = 0; d < 4; ++d) {
    const std::size_t dp = static_cast<std::size_t>(d / 2), tp = static_cast<std::size_t>(d % 2);
    EXPECT_EQ(u.local(d)(0, 0), x((tp * 2 + dp) * 2, 0));
  }
}

TEST(ShardedTensor, MemoryIsAccountedPerDeviceAndReleased) {
  auto mesh = create_mesh({1, 4, 1, 1});
  xt::xtensor<float, 2> x = xt::zeros<float>({64, 32});
  const std::int64_t full = 64 * 32 * sizeof(float);
  {
    auto s = shard<P<"fsdp", none>>(x, mesh);
    for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(mesh.memory().live(d), full / 4);
    auto r = shard<P<none, none>>(x, mesh);  // replicated: every device holds it all
    for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(mesh.memory().live(d), full / 4 + full);
    auto copy = s;
    EXPECT_EQ(mesh.memory().live(0), full / 4 * 2 + full);
    auto moved = std::move(copy);
    EXPECT_EQ(mesh.memory().live(0), full / 4 * 2 + full);
  }
  for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(mesh.memory().live(d), 0);
  EXPECT_EQ(mesh.memory().peak(0), full / 4 * 2 + full);
}

TEST(ShardedTensor, ReshardMovesBetweenSpecs) {
  auto mesh = create_mesh({2, 2, 2, 1});
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({8, 8});
  std::iota(x.begin(), x.end(), 0.0f);
  auto a = shard<P<"fsdp", "tp">>(x, mesh);
  auto b = reshard<P<"tp", axes("dp", "fsdp")>>(a, mesh);
  EXPECT_EQ(gather(b), x);
  EXPECT_EQ(b.block_shape(), (std::vector<std::int64_t>{4, 2}));
}

// A dimension its axes do not divide is cut as JAX and torch.chunk cut it: blocks of
// ceil(n / k), the last shorter or empty; gathering gives the tensor back.
TEST(ShardedTensor, UnevenDimensionsSplitIntoCeilBlocks) {
  auto mesh = create_mesh({1, 1, 4, 1});
  xt::xtensor<float, 2> x = xt::zeros<float>({5, 3});
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(i);
  auto s = shard<P<"tp", none>>(x, mesh, "model.embed_tokens.weight");
  EXPECT_FALSE(s.layout().even());
  EXPECT_EQ(s.block_shape(), (std::vector<std::int64_t>{2, 3}));
  const std::vector<std::int64_t> rows{2, 2, 1, 0};
  for (std::int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(s.layout().local_shape(d), (std::vector<std::int64_t>{rows[static_cast<std::size_t>(d)], 3})) << d;
    ASSERT_EQ(s.local(d).shape(0), static_cast<std::size_t>(rows[static_cast<std::size_t>(d)]));
    for (std::size_t r = 0; r < s.local(d).shape(0); ++r)
      for (std::size_t c = 0; c < 3; ++c) EXPECT_EQ(s.local(d)(r, c), x(static_cast<std::size_t>(2 * d) + r, c));
  }
  EXPECT_EQ(gather(s), x);
  // Both dimensions, and a resharding between uneven layouts.
  auto mesh2 = create_mesh({1, 3, 2, 1});
  xt::xtensor<float, 2> y = xt::zeros<float>({7, 5});
  for (std::size_t i = 0; i < y.size(); ++i) y.data()[i] = static_cast<float>(i) * 0.5f;
  auto a = shard<P<"fsdp", "tp">>(y, mesh2);
  EXPECT_EQ(a.block_shape(), (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(a.layout().local_shape(5), (std::vector<std::int64_t>{1, 2}));  // fsdp 2, tp 1
  EXPECT_EQ(gather(a), y);
  EXPECT_EQ(gather(reshard<P<"tp", axes("dp", "fsdp")>>(a, mesh2)), y);
  // A counter-based fill gives the blocks of the whole tensor.
  const ShardLayout l(mesh2.shape(), SpecValue{{{"tp", "fsdp"}, {}}}, {7, 5}, "fill");
  auto f = sharded_from_index<float>(l, mesh2.context(), [](std::uint64_t first, std::span<float> out) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(first + j) * 0.5f;
  });
  EXPECT_EQ(gather(f), xt::xarray<float>(y));
  EXPECT_EQ(l.local_elements(5), 0);  // block 5 of 6 blocks of 2 rows starts past row 7: empty
}

// Where a split must be even (a tensor-parallel block of heads), check_divides names it.
TEST(ShardedTensor, CheckDividesNamesTensorAndSizes) {
  const MeshShape mesh({"tp"}, {4});
  try {
    SpecValue{{{"tp"}, {}}}.check_divides(mesh, std::vector<std::int64_t>{6, 8}, "model.layers.0.self_attn.q_proj.weight");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::not_divisible);
    const std::string m = e.what();
    EXPECT_NE(m.find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("not divisible by 4"), std::string::npos) << m;
  }
}

TEST(ShardedArray, RunTimeSpecErrors) {
  auto mesh = create_mesh({1, 2, 2, 1});
  const auto x = iota_array({4, 4});
  auto code_of = [&](const SpecValue& s) {
    try {
      (void)shard(x, s, mesh, "w");
    } catch (const Error& e) {
      return e.code();
    }
    return errc::unsupported;  // no error at all
  };
  EXPECT_EQ(code_of(SpecValue{{{"tp"}, {"tp"}}}), errc::axis_reused);
  EXPECT_EQ(code_of(SpecValue{{{"model"}, {}}}), errc::unknown_axis);
  EXPECT_EQ(code_of(SpecValue{{{"tp"}}}), errc::shape_mismatch);
  EXPECT_EQ(code_of(SpecValue{{{"tp"}, {}, {}}}), errc::shape_mismatch);
  EXPECT_EQ(code_of(SpecValue{{{"tp", "fsdp", "dp"}, {}}}), errc::unsupported);  // 4 rows / 4 devices fits
}

// A placed layout (an expert on its ep rank): only the devices at the axis coordinate hold a
// block, split by the spec among them; the others hold nothing and account nothing; gather
// reads the holders and round-trips; the placement cannot name an axis the spec splits over.
TEST(ShardedArray, PlacedLayoutLivesOnOneCoordinateOfAnAxis) {
  auto mesh = create_mesh({1, 2, 2, 1, 1});  // fsdp = 2, ep = 2
  const auto full = iota_array({4, 6});
  const ShardLayout base(mesh.shape(), SpecValue({{"fsdp"}, {}}), {4, 6}, "w");
  const ShardLayout placed = base.placed_on("ep", 1);
  std::vector<std::int64_t> holders;
  for (std::int64_t d = 0; d < mesh.size(); ++d)
    if (placed.holds(d)) holders.push_back(d);
  EXPECT_EQ(holders, (std::vector<std::int64_t>{1, 3}));  // (fsdp, ep) = (0, 1) and (1, 1)
  EXPECT_EQ(placed.block_owners(), holders);
  EXPECT_EQ(placed.local_shape(0), (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(placed.local_shape(3), (std::vector<std::int64_t>{2, 6}));
  {
    const ShardedArray<float> a = shard(full, placed, mesh.context());
    EXPECT_EQ(a.local(0).size(), 0u);
    EXPECT_EQ(a.local(2).size(), 0u);
    EXPECT_EQ(a.local(3)(0, 0), 12.0f);  // rows 2-3
    EXPECT_EQ(mesh.memory().live(0), 0);
    EXPECT_EQ(mesh.memory().live(1), 12 * 4);
    EXPECT_EQ(gather(a), full);
  }
  EXPECT_EQ(mesh.memory().live(1), 0);
  EXPECT_FALSE(base == placed);
  EXPECT_THROW(ShardLayout(mesh.shape(), SpecValue({{"ep"}, {}}), {4, 6}, "w").placed_on("ep", 0), Error);
  EXPECT_THROW(base.placed_on("ep", 2), Error);
}

TEST(PartitionSpec, CompileTimeProperties) {
  using S = P<axes("dp", "fsdp"), none, "tp">;
  static_assert(S::rank == 3);
  static_assert(S::fits_axes<"dp", "fsdp", "tp", "sp">());
  static_assert(!S::fits_axes<"dp", "tp">());
  static_assert(S::entries[0].count == 2 && S::entries[1].replicated());
  EXPECT_EQ(S::value().str(), "P(('dp', 'fsdp'), None, 'tp')");
  EXPECT_EQ(S::value(), (SpecValue{{{"dp", "fsdp"}, {}, {"tp"}}}));
}

}  // namespace
}  // namespace edl
