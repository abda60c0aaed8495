// Tests for edl/optim/{optimizer,schedule,clip}.hpp: AdamW equals PyTorch's step on the
// oracle fixture; SGD (momentum, Nesterov), Lion and Adafactor equal naive double-precision
// loops written from their papers / torch docs; bf16 parameters keep f32 master weights;
// schedules and clipping match closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <edl/io/safetensors.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/optim/all.hpp>

namespace edl::optim {
namespace {

std::string data_dir() {
  const char* d = std::getenv("EDL_TEST_DATA");
  return d ? d : "tests/data";
}

// A two-parameter "model": a matrix (decayed by default) and a vector (not decayed).
template <class T = float>
struct Toy {
  nn::Param<T, P<none, none>> w{{3, 4}};
  nn::Param<T, P<none>> b{{5}};
  template <class F>
  void visit_params(std::string_view prefix, F&& f) {
    f(nn::join_path(prefix, "w"), w);
    f(nn::join_path(prefix, "b"), b);
  }
};

template <class T>
void fill_toy(Toy<T>& t, int step) {
  float* gw = t.w.grad_data();
  float* gb = t.b.grad_data();
  for (int i = 0; i < 12; ++i) {
    if (step == 0) t.w.value.data()[i] = from_f32<T>(0.1f * static_cast<float>(i) - 0.5f);
    gw[i] = std::sin(0.7f * static_cast<float>(i + 3 * step)) * 0.3f;
  }
  for (int i = 0; i < 5; ++i) {
    if (step == 0) t.b.value.data()[i] = from_f32<T>(1.0f + 0.01f * static_cast<float>(i));
    gb[i] = std::cos(1.3f * static_cast<float>(i + step)) * 0.2f;
  }
}

TEST(AdamW, OneStepEqualsTorchOnTheOracleFixture) {
  const std::string dir = data_dir() + "/tiny_hf";
  auto model = models::LlamaForCausalLM<>(models::LlamaConfig::from_file(dir + "/config.json"));
  const auto weights = io::SafeTensorsFile::open(dir + "/model.safetensors");
  const auto grads = io::SafeTensorsFile::open(dir + "/oracle/grads.safetensors");
  const auto after = io::SafeTensorsFile::open(dir + "/oracle/params_after_step.safetensors");
  model.visit_params("", [&](std::string_view path, auto& p) {
    weights.read_into<float>(std::string(path), std::span<float>(p.data(), p.value.size()));
    grads.read_into<float>(std::string(path), std::span<float>(p.grad_data(), p.value.size()));
  });
  OptimizerOptions o;
  o.b1 = 0.9, o.b2 = 0.95, o.eps = 1e-8, o.weight_decay = 0.1, o.decay_all = true;  // torch's defaults
  Optimizer opt(o);
  opt.step(model, 1e-3);
  std::int64_t n = 0, off = 0;
  model.visit_params("", [&](std::string_view path, auto& p) {
    const auto ref = after.read_vector<float>(std::string(path));
    for (std::int64_t i = 0; i < p.numel(); ++i, ++n) {
      // The first step moves every element by about lr; elements whose gradient is near eps
      // (|g| ~ 1e-8) legitimately differ by part of that, so count rather than demand all.
      if (std::abs(p.data()[i] - ref[static_cast<std::size_t>(i)]) > 2e-6f) ++off;
    }
  });
  EXPECT_EQ(n, 6736);
  EXPECT_LE(off, n / 200) << off << " of " << n << " parameters differ from torch by more than 2e-6";
}

TEST(AdamW, ThreeStepsEqualNaiveLoopAndSkipDecayOnVectors) {
  Toy<> t;
  OptimizerOptions o;
  o.b1 = 0.9, o.b2 = 0.99, o.eps = 1e-8, o.weight_decay = 0.1;
  Optimizer opt(o);
  std::vector<double> w(12), m(12, 0), v(12, 0), b(5), mb(5, 0), vb(5, 0);
  for (int step = 0; step < 3; ++step) {
    fill_toy(t, step);
    if (step == 0) {
      for (int i = 0; i < 12; ++i) w[i] = t.w.value.data()[i];
      for (int i = 0; i < 5; ++i) b[i] = t.b.value.data()[i];
    }
    const double lr = 0.01, k = step + 1;
    auto ref = [&](std::vector<double>& p, std::vector<double>& m1, std::vector<double>& v1, const float* g, double wd) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] *= 1 - lr * wd;
        m1[i] = 0.9 * m1[i] + 0.1 * g[i];
        v1[i] = 0.99 * v1[i] + 0.01 * g[i] * g[i];
        const double mh = m1[i] / (1 - std::pow(0.9, k)), vh = v1[i] / (1 - std::pow(0.99, k));
        p[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
      }
    };
    ref(w, m, v, t.w.grad.data(), 0.1);
    ref(b, mb, vb, t.b.grad.data(), 0.0);  // vectors are not decayed by default
    opt.step(t, lr);
  }
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(t.w.value.data()[i], w[i], 2e-6);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(t.b.value.data()[i], b[i], 2e-6);
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_EQ(opt.state_bytes(), (12 + 5) * 2 * 4);
}

TEST(SGD, MomentumAndNesterovEqualTorchDefinition) {
  for (bool nesterov : {false, true}) {
    Toy<> t;
    OptimizerOptions o;
    o.kind = OptimizerKind::sgd, o.momentum = 0.9, o.nesterov = nesterov, o.weight_decay = 0.01;
    Optimizer opt(o);
    std::vector<double> w(12), buf(12, 0);
    for (int step = 0; step < 3; ++step) {
      fill_toy(t, step);
      if (step == 0)
        for (int i = 0; i < 12; ++i) w[i] = t.w.value.data()[i];
      for (int i = 0; i < 12; ++i) {
        double g = t.w.grad.data()[i] + 0.01 * w[i];
        buf[i] = step == 0 ? g : 0.9 * buf[i] + g;
        g = nesterov ? g + 0.9 * buf[i] : buf[i];
        w[i] -= 0.05 * g;
      }
      opt.step(t, 0.05);
    }
    for (int i = 0; i < 12; ++i) EXPECT_NEAR(t.w.value.data()[i], w[i], 1e-6) << nesterov;
  }
}

TEST(Lion, EqualsPaperUpdate) {
  Toy<> t;
  OptimizerOptions o;
  o.kind = OptimizerKind::lion, o.b1 = 0.9, o.b2 = 0.99, o.weight_decay = 0.1;
  Optimizer opt(o);
  std::vector<double> w(12), m(12, 0);
  for (int step = 0; step < 3; ++step) {
    fill_toy(t, step);
    if (step == 0)
      for (int i = 0; i < 12; ++i) w[i] = t.w.value.data()[i];
    for (int i = 0; i < 12; ++i) {
      const double g = t.w.grad.data()[i], c = 0.9 * m[i] + 0.1 * g;
      w[i] -= 1e-3 * (((c > 0) - (c < 0)) + 0.1 * w[i]);
      m[i] = 0.99 * m[i] + 0.01 * g;
    }
    opt.step(t, 1e-3);
  }
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(t.w.value.data()[i], w[i], 1e-6);
}

// torch.optim.RMSprop's update, written out in double precision from its documentation, with
// and without momentum and centering (weight decay added to the gradient; the vector is not
// decayed, as with every edl optimizer unless decay_all).
TEST(RmsProp, EqualsTorchsUpdate) {
  for (const bool centered : {false, true})
    for (const double mu : {0.0, 0.9}) {
      SCOPED_TRACE(std::string(centered ? "centered" : "plain") + " momentum " + std::to_string(mu));
      Toy<> t;
      OptimizerOptions o;
      o.kind = OptimizerKind::rmsprop, o.rmsprop_alpha = 0.95, o.rmsprop_centered = centered, o.momentum = mu;
      o.eps = 1e-6, o.weight_decay = 0.1;
      Optimizer opt(o);
      std::vector<double> w(12), b(5), sq(17, 0), ga(17, 0), buf(17, 0);
      for (int step = 0; step < 4; ++step) {
        fill_toy(t, step);
        if (step == 0) {
          for (int i = 0; i < 12; ++i) w[i] = t.w.value.data()[i];
          for (int i = 0; i < 5; ++i) b[i] = t.b.value.data()[i];
        }
        for (int i = 0; i < 17; ++i) {
          const bool mat = i < 12;
          double& p = mat ? w[i] : b[i - 12];
          const double g = (mat ? t.w.grad.data()[i] : t.b.grad.data()[i - 12]) + (mat ? 0.1 * p : 0.0);
          sq[i] = 0.95 * sq[i] + 0.05 * g * g;
          double avg = sq[i];
          if (centered) {
            ga[i] = 0.95 * ga[i] + 0.05 * g;
            avg -= ga[i] * ga[i];
          }
          avg = std::sqrt(avg) + 1e-6;
          if (mu > 0) {
            buf[i] = mu * buf[i] + g / avg;
            p -= 1e-2 * buf[i];
          } else {
            p -= 1e-2 * g / avg;
          }
        }
        opt.step(t, 1e-2);
      }
      for (int i = 0; i < 12; ++i) EXPECT_NEAR(t.w.value.data()[i], w[i], 2e-6) << i;
      for (int i = 0; i < 5; ++i) EXPECT_NEAR(t.b.value.data()[i], b[i], 2e-6) << i;
      EXPECT_NE(opt.find_slot("w", "square_avg"), nullptr);
      EXPECT_EQ(opt.find_slot("w", "grad_avg") != nullptr, centered);
      EXPECT_EQ(opt.find_slot("w", "momentum_buffer") != nullptr, mu > 0);
    }
}

TEST(Adafactor, FactoredSecondMomentEqualsNaiveLoop) {
  Toy<> t;
  OptimizerOptions o;
  o.kind = OptimizerKind::adafactor;
  Optimizer opt(o);
  std::vector<double> w(12), vr(3, 0), vc(4, 0);
  for (int step = 0; step < 2; ++step) {
    fill_toy(t, step);
    if (step == 0)
      for (int i = 0; i < 12; ++i) w[i] = t.w.value.data()[i];
    const double beta2 = 1 - std::pow(step + 1.0, -0.8);
    const float* g = t.w.grad.data();
    for (int r = 0; r < 3; ++r) {
      double s = 0;
      for (int c = 0; c < 4; ++c) s += g[r * 4 + c] * static_cast<double>(g[r * 4 + c]) + 1e-30;
      vr[r] = beta2 * vr[r] + (1 - beta2) * s / 4;
    }
    for (int c = 0; c < 4; ++c) {
      double s = 0;
      for (int r = 0; r < 3; ++r) s += g[r * 4 + c] * static_cast<double>(g[r * 4 + c]) + 1e-30;
      vc[c] = beta2 * vc[c] + (1 - beta2) * s / 3;
    }
    const double rm = (vr[0] + vr[1] + vr[2]) / 3;
    std::vector<double> u(12);
    double sq = 0;
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) {
        u[r * 4 + c] = g[r * 4 + c] / std::sqrt(vr[r] * vc[c] / rm);
        sq += u[r * 4 + c] * u[r * 4 + c];
      }
    const double clip = 1 / std::max(1.0, std::sqrt(sq / 12));
    for (int i = 0; i < 12; ++i) w[i] -= 0.01 * u[i] * clip;
    opt.step(t, 0.01);
  }
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(t.w.value.data()[i], w[i], 1e-5);
}

// 16-bit parameters (bf16, and f16 for half()) step through an f32 master copy.
template <class Half>
void check_master_weights() {
  Toy<Half> t;
  Toy<float> f;
  Optimizer ob, of;
  for (int step = 0; step < 5; ++step) {
    fill_toy(t, step);
    fill_toy(f, step);
    if (step == 0)
      for (int i = 0; i < 12; ++i) f.w.value.data()[i] = to_f32(t.w.value.data()[i]);
    if (step == 0)
      for (int i = 0; i < 5; ++i) f.b.value.data()[i] = to_f32(t.b.value.data()[i]);
    ob.step(t, 1e-3);
    of.step(f, 1e-3);
  }
  // Updates of 1e-3 are below bf16's resolution near 1.0 (f16's is 1e-3 there); the master
  // copy keeps them, and the stored value is the master rounded to nearest even.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.b.value.data()[i], from_f32<Half>(f.b.value.data()[i]));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(t.w.value.data()[i], from_f32<Half>(f.w.value.data()[i]));
  std::vector<float> master;
  ob.visit_state([&](const std::string& path, const std::string& slot, const std::vector<float>& v) {
    if (path == "b" && slot == "master") master = v;
  });
  ASSERT_EQ(master.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(master[i], f.b.value.data()[i]);
}

TEST(Optimizer, Bf16ParametersKeepF32MasterWeights) { check_master_weights<bf16>(); }
TEST(Optimizer, F16ParametersKeepF32MasterWeights) { check_master_weights<f16>(); }

TEST(Schedule, ClosedForms) {
  Schedule s{ScheduleKind::cosine, 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1.0 / 11);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 10.0 / 11);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_NEAR(s.lr_at(60), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  Schedule l{ScheduleKind::linear, 1.0, 0.0, 0, 100};
  EXPECT_DOUBLE_EQ(l.lr_at(25), 0.75);
  Schedule w{ScheduleKind::warmup_stable_decay, 1.0, 0.0, 0, 100, 0.2};
  EXPECT_DOUBLE_EQ(w.lr_at(50), 1.0);
  EXPECT_NEAR(w.lr_at(90), 0.5, 1e-12);
  EXPECT_EQ(schedule_from_name("cosine"), ScheduleKind::cosine);
  EXPECT_THROW(schedule_from_name("exponential"), Error);
  EXPECT_THROW(optimizer_from_name("adam"), Error);
}

TEST(Clip, GlobalNormAndClipping) {
  Toy<> t;
  fill_toy(t, 0);
  double sq = 0;
  for (int i = 0; i < 12; ++i) sq += t.w.grad.data()[i] * static_cast<double>(t.w.grad.data()[i]);
  for (int i = 0; i < 5; ++i) sq += t.b.grad.data()[i] * static_cast<double>(t.b.grad.data()[i]);
  EXPECT_NEAR(global_grad_norm(t), std::sqrt(sq), 1e-9);
  const double before = clip_by_global_norm(t, 0.1);
  EXPECT_NEAR(before, std::sqrt(sq), 1e-9);
  EXPECT_NEAR(global_grad_norm(t), 0.1, 1e-6);
  EXPECT_NEAR(clip_by_global_norm(t, 10.0), 0.1, 1e-6);  // below the bound: unchanged
  EXPECT_NEAR(global_grad_norm(t), 0.1, 1e-6);
}

}  // namespace
}  // namespace edl::optim
