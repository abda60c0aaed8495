// tests/mesh/test_collectives.cpp: every collective of mesh/collectives.hpp (through the
// simulated backend) against its single-process definition written as naive loops, over
// many mesh shapes, axis subsets, dtypes and reduce ops; determinism; failure handling.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <stdexcept>
#include <string>
#include <vector>

#include <edl/core/exec.hpp>
#include <edl/mesh/all.hpp>

namespace {

using edl::bf16;
using edl::Device;
using edl::ReduceOp;

// ---------------------------------------------------------------- naive reference

using Shape = std::array<std::int64_t, 4>;
const std::vector<std::string> kAxes = {"dp", "fsdp", "tp", "sp"};

std::array<std::int64_t, 4> coords_of(const Shape& s, std::int64_t d) {
  std::array<std::int64_t, 4> c{};
  for (int i = 3; i >= 0; --i) {
    c[i] = d % s[i];
    d /= s[i];
  }
  return c;
}

/// Devices that agree with d on every axis not named, by increasing id (= row-major over the
/// named axes, since ids are row-major over all axes). Empty `axes` = whole mesh.
std::vector<std::int64_t> ref_group(const Shape& s, std::int64_t d, const std::vector<std::string>& axes) {
  std::array<bool, 4> named{};
  for (int i = 0; i < 4; ++i)
    for (const auto& a : axes) named[i] = named[i] || a == kAxes[i] || axes.empty();
  if (axes.empty()) named = {true, true, true, true};
  const std::int64_t n = s[0] * s[1] * s[2] * s[3];
  const auto cd = coords_of(s, d);
  std::vector<std::int64_t> g;
  for (std::int64_t e = 0; e < n; ++e) {
    const auto ce = coords_of(s, e);
    bool same = true;
    for (int i = 0; i < 4; ++i) same = same && (named[i] || ce[i] == cd[i]);
    if (same) g.push_back(e);
  }
  return g;
}

template <class T>
float wide(T v) {
  if constexpr (std::is_same_v<T, bf16>) return v.to_float();
  else return static_cast<float>(v);
}
template <class T>
T narrow(float v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16(v);
  else return static_cast<T>(v);
}

/// r = op over members (in order) of x[member][offset + i], combined in f32, rounded once.
template <class T>
std::vector<T> ref_reduce(const std::vector<std::vector<T>>& x, const std::vector<std::int64_t>& g, std::size_t offset,
                          std::size_t count, ReduceOp op) {
  std::vector<T> r(count);
  for (std::size_t i = 0; i < count; ++i) {
    float acc = wide(x[g[0]][offset + i]);
    for (std::size_t q = 1; q < g.size(); ++q) {
      const float v = wide(x[g[q]][offset + i]);
      if (op == ReduceOp::sum || op == ReduceOp::mean) acc = acc + v;
      if (op == ReduceOp::max) acc = v > acc ? v : acc;
      if (op == ReduceOp::min) acc = v < acc ? v : acc;
    }
    if (op == ReduceOp::mean) acc = acc / static_cast<float>(g.size());
    r[i] = narrow<T>(acc);
  }
  return r;
}

template <class T>
std::vector<std::uint16_t> bits(const std::vector<T>& v) {  // compare bf16 and f32 exactly
  std::vector<std::uint16_t> b(v.size() * sizeof(T) / 2);
  std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

/// Values with fractional parts and mixed signs/magnitudes so that order and rounding matter.
float value(std::int64_t d, std::size_t i, std::uint32_t salt) {
  std::uint32_t h = static_cast<std::uint32_t>(d) * 2654435761u ^ static_cast<std::uint32_t>(i) * 40503u ^ salt * 97u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return (static_cast<float>(h % 20001u) - 10000.0f) / 977.0f * (1.0f + static_cast<float>(h % 7u));
}

template <class T>
std::vector<std::vector<T>> make_inputs(std::int64_t n, std::size_t count, std::uint32_t salt) {
  std::vector<std::vector<T>> x(n, std::vector<T>(count));
  for (std::int64_t d = 0; d < n; ++d)
    for (std::size_t i = 0; i < count; ++i) x[d][i] = narrow<T>(value(d, i, salt));
  return x;
}

std::string axes_str(const std::vector<std::string>& axes) {
  std::string s = "{";
  for (const auto& a : axes) s += a + " ";
  return s + "}";
}

constexpr std::array<ReduceOp, 4> kOps = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::mean};

/// Runs every collective on one mesh over one axis set and checks each device's output.
template <class T>
void check_all_collectives(const Shape& shape, const std::vector<std::string>& axes) {
  SCOPED_TRACE("mesh (" + std::to_string(shape[0]) + "," + std::to_string(shape[1]) + "," + std::to_string(shape[2]) +
               "," + std::to_string(shape[3]) + ") axes " + axes_str(axes) +
               (std::is_same_v<T, bf16> ? " bf16" : " f32"));
  auto mesh = edl::create_mesh(shape);
  const std::int64_t n = mesh.size();
  const std::int64_t k = static_cast<std::int64_t>(ref_group(shape, 0, axes).size());
  const std::size_t count = 37;     // not a multiple of the group: uneven all_reduce chunks
  const std::size_t chunk = 5;      // per-member chunk of reduce_scatter / all_to_all
  const std::size_t big = chunk * static_cast<std::size_t>(k);

  const auto x = make_inputs<T>(n, count, 1);
  const auto y = make_inputs<T>(n, big, 2);
  edl::AxisList al{std::vector<std::string>(axes)};

  struct Out {
    std::array<std::vector<T>, 4> reduced, scattered;
    std::vector<T> gathered, a2a, ring, shift, bcast;
    std::int64_t index = -1, size = -1;
  };
  std::vector<Out> out(n);
  mesh.run([&](Device& dev) {
    Out& o = out[dev.id()];
    for (std::size_t j = 0; j < kOps.size(); ++j) {
      o.reduced[j] = x[dev.id()];
      edl::all_reduce(dev, o.reduced[j], kOps[j], al);
      o.scattered[j].resize(chunk);
      edl::reduce_scatter(dev, y[dev.id()], o.scattered[j], al, kOps[j]);
    }
    o.gathered.resize(count * k);
    edl::all_gather(dev, x[dev.id()], o.gathered, al);
    o.a2a.resize(big);
    edl::all_to_all(dev, y[dev.id()], o.a2a, al);
    o.ring.resize(count);
    edl::ppermute(dev, x[dev.id()], o.ring, al, edl::shift_pairs(k, 1));
    o.shift.resize(count);
    edl::ppermute(dev, x[dev.id()], o.shift, al, edl::shift_pairs(k, -1, false));
    o.bcast = x[dev.id()];
    edl::broadcast(dev, o.bcast, k - 1, al);
    edl::barrier(dev, al);
    o.index = edl::axis_index(dev, al);
    o.size = edl::axis_size(dev, al);
  });

  for (std::int64_t d = 0; d < n; ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    const auto g = ref_group(shape, d, axes);
    ASSERT_EQ(static_cast<std::int64_t>(g.size()), k);
    const auto p = static_cast<std::size_t>(std::find(g.begin(), g.end(), d) - g.begin());
    const Out& o = out[d];
    EXPECT_EQ(o.index, static_cast<std::int64_t>(p));
    EXPECT_EQ(o.size, k);
    for (std::size_t j = 0; j < kOps.size(); ++j) {
      SCOPED_TRACE(std::string("op ") + std::string(edl::reduce_op_name(kOps[j])));
      EXPECT_EQ(bits(o.reduced[j]), bits(ref_reduce(x, g, 0, count, kOps[j])));
      EXPECT_EQ(bits(o.scattered[j]), bits(ref_reduce(y, g, p * chunk, chunk, kOps[j])));
    }
    std::vector<T> gathered, a2a;
    for (auto m : g) gathered.insert(gathered.end(), x[m].begin(), x[m].end());
    for (auto m : g) a2a.insert(a2a.end(), y[m].begin() + p * chunk, y[m].begin() + (p + 1) * chunk);
    EXPECT_EQ(bits(o.gathered), bits(gathered));
    EXPECT_EQ(bits(o.a2a), bits(a2a));
    // ring: position p receives from p - 1 (wrapping); shift -1 without wrap: p receives from
    // p + 1, and the last position receives nothing, so zeros.
    EXPECT_EQ(bits(o.ring), bits(x[g[(p + k - 1) % k]]));
    const std::vector<T> zeros(count, narrow<T>(0.0f));
    EXPECT_EQ(bits(o.shift), bits(p + 1 < static_cast<std::size_t>(k) ? x[g[p + 1]] : zeros));
    EXPECT_EQ(bits(o.bcast), bits(x[g[k - 1]]));
  }
}

const std::vector<Shape> kShapes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1},
                                    {1, 1, 1, 2}, {2, 2, 2, 1}, {1, 4, 2, 1}, {2, 2, 2, 2}};
const std::vector<std::vector<std::string>> kAxisSets = {
    {}, {"dp"}, {"fsdp"}, {"tp"}, {"sp"}, {"dp", "fsdp"}, {"fsdp", "tp"}, {"dp", "tp", "sp"}, {"dp", "fsdp", "tp", "sp"}};

TEST(Collectives, MatchNaiveDefinitionsF32) {
  for (const auto& s : kShapes)
    for (const auto& a : kAxisSets) check_all_collectives<float>(s, a);
}

TEST(Collectives, MatchNaiveDefinitionsBF16) {
  for (const auto& s : kShapes)
    for (const auto& a : kAxisSets) check_all_collectives<bf16>(s, a);
}

TEST(Collectives, SixteenDevicesOnOneAxis) {
  check_all_collectives<float>({1, 16, 1, 1}, {"fsdp"});
  check_all_collectives<bf16>({1, 1, 16, 1}, {"tp"});
}

TEST(Collectives, MinusOneInferredMeshRuns) {
  auto mesh = edl::create_mesh({1, -1, 1, 1}, 8);
  std::vector<float> got(8);
  mesh.run([&](Device& dev) { got[dev.id()] = edl::psum(dev, static_cast<float>(dev.id()), "fsdp"); });
  for (float g : got) EXPECT_EQ(g, 28.0f);
}

// ---------------------------------------------------------------- determinism

TEST(Collectives, ReductionIsDeterministic) {
  // Magnitudes from 1e-3 to 1e7: f32 addition is far from associative here, so any change in
  // the combining order would change the bits.
  auto mesh = edl::create_mesh({2, 2, 2, 2});
  const std::size_t count = 4099;
  auto input = [](std::int64_t d, std::size_t i) {
    return value(d, i, 3) * std::pow(10.0f, static_cast<float>((d * 7 + static_cast<std::int64_t>(i)) % 11) - 3.0f);
  };
  std::vector<std::vector<float>> first;
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<std::vector<float>> out(16);
    std::vector<std::vector<bf16>> out16(16);
    mesh.run([&](Device& dev) {
      out[dev.id()].resize(count);
      out16[dev.id()].resize(count);
      for (std::size_t i = 0; i < count; ++i) {
        out[dev.id()][i] = input(dev.id(), i);
        out16[dev.id()][i] = bf16(input(dev.id(), i));
      }
      if (dev.id() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200 * (rep + 1)));
      edl::psum(dev, out[dev.id()]);
      edl::psum(dev, out16[dev.id()]);
    });
    // Same bits on every device, equal to the naive sum in device order.
    std::vector<float> ref(count);
    for (std::size_t i = 0; i < count; ++i) {
      float acc = input(0, i);
      for (std::int64_t d = 1; d < 16; ++d) acc += input(d, i);
      ref[i] = acc;
    }
    for (int d = 0; d < 16; ++d) {
      EXPECT_EQ(bits(out[d]), bits(ref)) << "device " << d;
      EXPECT_EQ(bits(out16[d]), bits(out16[0])) << "device " << d;
    }
    if (rep == 0) first = out;
    else EXPECT_EQ(bits(out[5]), bits(first[5])) << "run " << rep;
  }
}

// ---------------------------------------------------------------- in place, scalars, misc

TEST(Collectives, InPlaceBuffers) {
  auto mesh = edl::create_mesh({1, 1, 4, 1});
  std::vector<std::vector<float>> gathered(4), a2a(4), perm(4);
  mesh.run([&](Device& dev) {
    const auto p = static_cast<float>(dev.id());
    auto& g = gathered[dev.id()];
    g.assign(8, -1.0f);
    g[2 * dev.id()] = p, g[2 * dev.id() + 1] = p + 0.5f;  // own chunk already in place
    edl::all_gather(dev, std::span<const float>(g).subspan(2 * dev.id(), 2), g, "tp");
    auto& a = a2a[dev.id()];
    for (int i = 0; i < 4; ++i) a.push_back(10 * p + static_cast<float>(i));
    edl::all_to_all(dev, a, a, "tp");
    auto& r = perm[dev.id()];
    r = {p, p};
    edl::ppermute(dev, r, r, "tp", edl::shift_pairs(4, 1));
    // reduce_scatter into its own chunk of the input (NCCL's in-place form), and into the
    // start of the input (overlapping other members' chunks: handled with a private buffer).
    std::vector<float> in1(8), in2(8);
    for (int i = 0; i < 8; ++i) in1[i] = in2[i] = static_cast<float>(i) + p;
    const std::size_t me = static_cast<std::size_t>(dev.id());
    edl::reduce_scatter(dev, in1, std::span<float>(in1).subspan(2 * me, 2), "tp");
    edl::reduce_scatter(dev, in2, std::span<float>(in2).subspan(0, 2), "tp");
    const float e0 = 4.0f * static_cast<float>(2 * me) + 6.0f;  // sum over devices of (2me + d)
    EXPECT_EQ(in1[2 * me], e0);
    EXPECT_EQ(in1[2 * me + 1], e0 + 4.0f);
    EXPECT_EQ(in2[0], e0);
    EXPECT_EQ(in2[1], e0 + 4.0f);
  });
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(gathered[d], (std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f}));
    for (int q = 0; q < 4; ++q) EXPECT_EQ(a2a[d][q], static_cast<float>(10 * q + d));
    EXPECT_EQ(perm[d], (std::vector<float>(2, static_cast<float>((d + 3) % 4))));
  }
}

TEST(Collectives, ScalarsIntegersAndAxisIndex) {
  auto mesh = edl::create_mesh({2, 1, 2, 1});
  std::vector<std::int64_t> idx(4), sz(4);
  std::vector<float> mean(4), mx(4);
  std::vector<std::int32_t> isum(4);
  mesh.run([&](Device& dev) {
    idx[dev.id()] = edl::axis_index(dev, {"dp", "tp"});
    EXPECT_EQ(edl::axis_index(dev, "tp"), dev.id() % 2);
    EXPECT_EQ(dev.axis_index("dp"), dev.id() / 2);
    sz[dev.id()] = edl::axis_size(dev, {"dp", "tp"});
    mean[dev.id()] = edl::pmean(dev, static_cast<float>(dev.id()), "dp");
    mx[dev.id()] = edl::pmax(dev, static_cast<float>(dev.id()));
    std::vector<std::int32_t> v{static_cast<std::int32_t>(dev.id() + 1)};
    edl::psum(dev, std::span<std::int32_t>(v));
    isum[dev.id()] = v[0];
  });
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(idx[d], d);
    EXPECT_EQ(sz[d], 4);
    EXPECT_EQ(mean[d], d % 2 == 0 ? 1.0f : 2.0f);
    EXPECT_EQ(mx[d], 3.0f);
    EXPECT_EQ(isum[d], 10);
  }
}

TEST(Collectives, KernelsInsideDevicesShareTheTbbPool) {
  auto mesh = edl::create_mesh({1, 16, 1, 1});
  std::vector<double> got(16);
  mesh.run([&](Device& dev) {
    std::vector<float> v(10000);
    edl::exec::parallel_for(0, 10000, 512, [&](std::ptrdiff_t lo, std::ptrdiff_t hi) {
      for (auto i = lo; i < hi; ++i) v[i] = static_cast<float>(dev.id());
    });
    edl::psum(dev, v, "fsdp");
    got[dev.id()] = v[9999];
  });
  for (double g : got) EXPECT_EQ(g, 120.0);
}

TEST(Collectives, TrafficIsCounted) {
  auto mesh = edl::create_mesh({2, 1, 2, 1});
  auto& sim = dynamic_cast<edl::SimulatedBackend&>(mesh.backend());
  EXPECT_EQ(sim.name(), "simulated");
  mesh.run([&](Device& dev) {
    std::vector<float> v(4, 1.0f);
    edl::psum(dev, v, "tp");  // ring all_reduce of 16 bytes over 2: 2 * 1/2 * 16 = 16 sent
  });
  const auto t = sim.traffic();
  ASSERT_EQ(t.count("tp"), 1u);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(t.at("tp")[d], 16);
}

// ---------------------------------------------------------------- errors

template <class F>
edl::Error run_expecting_error(edl::DefaultMesh& mesh, F&& body) {
  try {
    mesh.run(body);
  } catch (const edl::Error& e) {
    return e;
  }
  ADD_FAILURE() << "run() did not throw";
  return edl::Error(edl::errc::invalid_argument, "test", "no error");
}

TEST(CollectiveErrors, ThrowingDeviceDoesNotHang) {
  auto mesh = edl::create_mesh({2, 2, 2, 2});
  for (int when = 0; when < 3; ++when) {
    const auto e = run_expecting_error(mesh, [&](Device& dev) {
      std::vector<float> v(64, 1.0f);
      for (int step = 0; step < 3; ++step) {
        if (dev.id() == 5 && step == when) throw std::runtime_error("boom");
        edl::psum(dev, v, {"dp", "fsdp"});
        edl::psum(dev, v);
      }
    });
    EXPECT_EQ(e.code(), edl::errc::device_failure);
    EXPECT_NE(std::string(e.what()).find("device 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
  // An edl::Error keeps its code; the mesh works again afterwards.
  const auto e = run_expecting_error(mesh, [&](Device& dev) {
    if (dev.id() == 11) throw edl::Error(edl::errc::invalid_argument, "my_layer", "bad input");
    edl::barrier(dev);
  });
  EXPECT_EQ(e.code(), edl::errc::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("device 11"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("my_layer: bad input"), std::string::npos) << e.what();
  std::atomic<int> ok{0};
  mesh.run([&](Device& dev) { ok += static_cast<int>(edl::psum(dev, 1.0f)); });
  EXPECT_EQ(ok.load(), 16 * 16);
}

TEST(CollectiveErrors, MismatchedCountsAndOps) {
  auto mesh = edl::create_mesh({1, 1, 4, 1});
  auto e = run_expecting_error(mesh, [&](Device& dev) {
    std::vector<float> v(dev.id() == 2 ? 8 : 4, 1.0f);
    edl::psum(dev, v, "tp");
  });
  EXPECT_EQ(e.code(), edl::errc::collective);
  EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("count"), std::string::npos) << e.what();

  e = run_expecting_error(mesh, [&](Device& dev) {
    std::vector<float> v(4, 1.0f), w(16);
    if (dev.id() == 0) edl::all_gather(dev, v, w, "tp");
    else edl::psum(dev, v, "tp");
  });
  EXPECT_EQ(e.code(), edl::errc::collective);
  EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();

  e = run_expecting_error(mesh, [&](Device& dev) {
    std::vector<float> v(4, 1.0f);
    if (dev.id() == 3) {
      std::vector<bf16> b(4);
      edl::psum(dev, b, "tp");
    } else {
      edl::psum(dev, v, "tp");
    }
  });
  EXPECT_EQ(e.code(), edl::errc::collective);
  EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
}

TEST(CollectiveErrors, DeadlocksAreReported) {
  auto mesh = edl::create_mesh({2, 1, 2, 1});
  // Device 0 returns without the psum the others wait in.
  auto e = run_expecting_error(mesh, [&](Device& dev) {
    if (dev.id() == 0) return;
    edl::psum(dev, 1.0f);
  });
  EXPECT_EQ(e.code(), edl::errc::collective);
  EXPECT_NE(std::string(e.what()).find("returned"), std::string::npos) << e.what();
  // tp=0 devices reduce over dp, tp=1 devices over tp: the tp groups never fill.
  e = run_expecting_error(mesh, [&](Device& dev) {
    edl::psum(dev, 1.0f, dev.axis_index("tp") == 0 ? "dp" : "tp");
  });
  EXPECT_EQ(e.code(), edl::errc::collective);
  EXPECT_NE(std::string(e.what()).find("waits in all_reduce"), std::string::npos) << e.what();
}

TEST(CollectiveErrors, UnknownAxisAndBadSizes) {
  auto mesh = edl::create_mesh({2, 1, 2, 1});
  auto e = run_expecting_error(mesh, [&](Device& dev) { edl::psum(dev, 1.0f, {"dp", "model"}); });
  EXPECT_EQ(e.code(), edl::errc::unknown_axis);
  EXPECT_NE(std::string(e.what()).find("\"model\""), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("psum"), std::string::npos) << e.what();

  e = run_expecting_error(mesh, [&](Device& dev) {
    std::vector<float> in(3), out(5);
    edl::all_gather(dev, in, out, "tp");
  });
  EXPECT_EQ(e.code(), edl::errc::shape_mismatch);

  e = run_expecting_error(mesh, [&](Device& dev) {
    std::vector<float> in(3), out(3);
    edl::ppermute(dev, in, out, "tp", {{0, 1}, {1, 1}});
  });
  EXPECT_EQ(e.code(), edl::errc::invalid_argument);

  e = run_expecting_error(mesh, [&](Device& dev) { mesh.run([](Device&) {}); });
  EXPECT_EQ(e.code(), edl::errc::unsupported);
}

}  // namespace
