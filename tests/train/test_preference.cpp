// Tests for edl/train/preference.hpp: DPO's sigmoid and IPO losses and ORPO's odds-ratio loss
// against the formulas evaluated on log-probabilities computed one sequence at a time (an
// independent path through LlamaForCausalLM::loss), the step-0 invariants (reference ==
// policy: loss log 2, rewards 0), the gradient against central finite differences, and the
// LoRA reference (the policy with its adapters switched off) against an explicit base copy.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include <edl/core/rng.hpp>
#include <edl/lora/apply.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/tokenizer/bpe_trainer.hpp>
#include <edl/train/preference.hpp>
#include <edl/train/sft_data.hpp>
#include <edl/train/trainer.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace edl::train {
namespace {

using Model = models::LlamaForCausalLM<>;

models::LlamaConfig tiny() {
  models::LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

Model model(std::uint64_t seed) {
  Model m(tiny());
  m.init(Key::from_seed(seed), 0.3f);
  return m;
}

/// Three pairs: a shared prompt, then chosen / rejected completions of different lengths.
struct Pairs {
  std::vector<std::vector<std::int32_t>> seqs;
  std::vector<std::vector<std::uint8_t>> masks;
  Batch batch() const {
    std::vector<std::span<const std::int32_t>> s;
    std::vector<std::span<const std::uint8_t>> m;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      s.emplace_back(seqs[i]);
      m.emplace_back(masks[i]);
    }
    return preference_batch(s, m, 64, 0);
  }
};

Pairs pairs() {
  Pairs p;
  for (int i = 0; i < 3; ++i)
    for (int side = 0; side < 2; ++side) {
      const int prompt = 3 + i, completion = 2 + side + i;
      std::vector<std::int32_t> ids;
      std::vector<std::uint8_t> mask;
      for (int t = 0; t < prompt + completion; ++t) {
        ids.push_back(static_cast<std::int32_t>((7 * t + 11 * i + 5 * side * (t >= prompt)) % 40));
        mask.push_back(t >= prompt);
      }
      p.seqs.push_back(ids);
      p.masks.push_back(mask);
    }
  return p;
}

/// log p of sequence k's completion, one sequence at a time through Model::loss.
double logp_alone(const Model& m, const Pairs& p, std::size_t k) {
  const auto& ids = p.seqs[k];
  std::vector<std::int64_t> in(ids.begin(), ids.end()), labels(ids.size());
  std::int64_t n = 0;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    labels[t] = p.masks[k][t] ? ids[t] : -100;
    n += t > 0 && p.masks[k][t];
  }
  const nn::LossMetrics l = m.loss(in.data(), nn::TokenLayout{1, static_cast<std::int64_t>(ids.size())}, labels.data());
  return -l.loss * static_cast<double>(n);
}

std::int64_t completion_targets(const Pairs& p, std::size_t k) {
  std::int64_t n = 0;
  for (std::size_t t = 1; t < p.masks[k].size(); ++t) n += p.masks[k][t];
  return n;
}

}  // namespace

TEST(Preference, WithTheReferenceEqualToThePolicyTheLossIsLog2AndTheRewardsZero) {
  const Model ref = model(1);
  Model pol = ref;
  const Batch b = pairs().batch();
  for (double eps : {0.0, 0.1}) {
    PreferenceOptions o;
    o.beta = 0.5;
    o.label_smoothing = eps;
    const PreferenceMetrics m = preference_loss(pol, ref, b, o, false);
    EXPECT_NEAR(m.loss, std::log(2.0), 1e-12);
    EXPECT_EQ(m.rewards_chosen, 0.0);
    EXPECT_EQ(m.rewards_rejected, 0.0);
    EXPECT_EQ(m.rewards_margins, 0.0);
    EXPECT_EQ(m.pairs, 3);
  }
  PreferenceOptions ipo;
  ipo.loss_type = "ipo";
  ipo.beta = 0.5;
  EXPECT_NEAR(preference_loss(pol, ref, b, ipo, false).loss, 1.0, 1e-12);  // (0 - 1 / (2 beta))^2
}

TEST(Preference, LossesAndRewardsEqualTheFormulasOnSequenceLogProbabilities) {
  const Model ref = model(1);
  Model pol = model(2);
  const Pairs p = pairs();
  const Batch b = p.batch();
  for (const char* type : {"sigmoid", "ipo"}) {
    PreferenceOptions o;
    o.loss_type = type;
    o.beta = 0.3;
    o.label_smoothing = std::string(type) == "sigmoid" ? 0.1 : 0.0;
    double want = 0, chosen = 0, rejected = 0, lc = 0, acc = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const std::size_t c = 2 * i, r = c + 1;
      double pc = logp_alone(pol, p, c), rc = logp_alone(ref, p, c), pr = logp_alone(pol, p, r), rr = logp_alone(ref, p, r);
      chosen += o.beta * (pc - rc) / 3;
      rejected += o.beta * (pr - rr) / 3;
      lc += pc / 3;
      acc += (pc - rc > pr - rr) / 3.0;
      if (std::string(type) == "ipo") {
        const double kc = static_cast<double>(completion_targets(p, c)), kr = static_cast<double>(completion_targets(p, r));
        pc /= kc, rc /= kc, pr /= kr, rr /= kr;
        const double e = (pc - rc) - (pr - rr) - 1 / (2 * o.beta);
        want += e * e / 3;
      } else {
        const double z = o.beta * ((pc - rc) - (pr - rr));
        want += (-(1 - o.label_smoothing) * std::log(1 / (1 + std::exp(-z))) -
                 o.label_smoothing * std::log(1 / (1 + std::exp(z)))) / 3;
      }
    }
    const PreferenceMetrics m = preference_loss(pol, ref, b, o, false);
    EXPECT_NEAR(m.loss, want, 1e-5 * std::fabs(want) + 1e-6) << type;
    if (std::string(type) == "sigmoid") {
      EXPECT_NEAR(m.rewards_chosen, chosen, 1e-5);
      EXPECT_NEAR(m.rewards_rejected, rejected, 1e-5);
      EXPECT_NEAR(m.rewards_margins, chosen - rejected, 1e-5);
      EXPECT_NEAR(m.logps_chosen, lc, 1e-4);
      EXPECT_EQ(m.rewards_accuracies, acc);
    }
  }
}

// ORPO (TRL's ORPOTrainer): the chosen completions' NLL averaged over their tokens, minus beta
// times the mean log sigmoid of the log odds ratio of the token-averaged log-probabilities.
TEST(Preference, OrpoEqualsTheOddsRatioFormula) {
  const Model pol = model(2);
  const Pairs p = pairs();
  const Batch b = p.batch();
  PreferenceOptions o;
  o.orpo = true;
  o.beta = 0.25;
  double nll = 0, tokens = 0, ratio = 0, odds = 0, chosen = 0, rejected = 0, acc = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t c = 2 * i, r = c + 1;
    nll -= logp_alone(pol, p, c);
    tokens += static_cast<double>(completion_targets(p, c));
    const double a = logp_alone(pol, p, c) / static_cast<double>(completion_targets(p, c));
    const double bb = logp_alone(pol, p, r) / static_cast<double>(completion_targets(p, r));
    const double lo = (a - bb) - (std::log1p(-std::exp(a)) - std::log1p(-std::exp(bb)));
    ratio += std::log(1 / (1 + std::exp(-lo))) / 3;
    odds += lo / 3;
    chosen += o.beta * a / 3;
    rejected += o.beta * bb / 3;
    acc += (a > bb) / 3.0;
  }
  Model policy = pol;
  const PreferenceMetrics m = preference_loss(policy, b, o, false);
  EXPECT_NEAR(m.nll_loss, nll / tokens, 1e-5);
  EXPECT_NEAR(m.log_odds_ratio, ratio, 1e-5);
  EXPECT_NEAR(m.log_odds_chosen, odds, 1e-5);
  EXPECT_NEAR(m.loss, nll / tokens - o.beta * ratio, 1e-5);
  EXPECT_NEAR(m.rewards_chosen, chosen, 1e-6);
  EXPECT_NEAR(m.rewards_rejected, rejected, 1e-6);
  EXPECT_NEAR(m.logps_chosen, chosen / o.beta, 1e-5);
  EXPECT_EQ(m.rewards_accuracies, acc);
  // Without adapters, DPO has no reference to take from the policy: a clear error.
  PreferenceOptions dpo;
  EXPECT_THROW(preference_loss(policy, b, dpo, false), Error);
}

// DPO with LoRA: the reference is the policy with its adapters switched off, which computes
// exactly what an explicit copy of the base does (loss, rewards and every gradient).
TEST(Preference, TheLoraReferenceIsTheBaseWithoutACopy) {
  Model pol = model(2);
  const Model base = pol;
  lora::LoraConfig lc;
  lc.r = 4;
  lc.lora_alpha = 8;
  lc.target_modules = {"q_proj", "v_proj", "down_proj"};
  lora::apply_lora(pol, lc);
  // Non-zero B, so the adapted policy differs from its base.
  std::uint64_t k = 0;
  pol.visit_params("", [&](std::string_view name, auto& prm) {
    if (name.find("lora_B") == std::string_view::npos) return;
    for (std::int64_t i = 0; i < prm.numel(); ++i) prm.data()[i] = 0.05f * static_cast<float>(((k++ * 37) % 11)) - 0.25f;
  });
  Model twin = pol;
  const Batch b = pairs().batch();
  PreferenceOptions o;
  o.beta = 0.3;
  nn::zero_grad(pol);
  nn::zero_grad(twin);
  const PreferenceMetrics off = preference_loss(pol, b, o, true);
  const PreferenceMetrics copy = preference_loss(twin, base, b, o, true);
  EXPECT_NE(off.rewards_margins, 0.0);
  EXPECT_EQ(off.loss, copy.loss);
  EXPECT_EQ(off.rewards_chosen, copy.rewards_chosen);
  EXPECT_EQ(off.rewards_rejected, copy.rewards_rejected);
  std::vector<float> g1, g2;
  pol.visit_params("", [&](std::string_view, auto& prm) {
    if (const float* g = prm.trainable_grad()) g1.insert(g1.end(), g, g + prm.numel());
  });
  twin.visit_params("", [&](std::string_view, auto& prm) {
    if (const float* g = prm.trainable_grad()) g2.insert(g2.end(), g, g + prm.numel());
  });
  ASSERT_FALSE(g1.empty());
  EXPECT_EQ(g1, g2);
  // The adapters are back on after the reference's forward.
  EXPECT_TRUE(lora::lora_is_enabled(pol));
  EXPECT_EQ(preference_loss(pol, b, o, false).loss, off.loss);
  // On a mesh the reference is the sharded policy with its adapters off: the same loss, rewards
  // and adapter gradients within f32 rounding.
  Batch even = b;
  pad_to_multiple(even, 2, 0);
  nn::zero_grad(pol);
  const PreferenceMetrics want = preference_loss(pol, even, o, true);
  for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {1, 1, 1, 2}}) {
    auto sm = models::shard_model(twin, create_mesh(dims));
    sm.zero_grad();
    const PreferenceMetrics got = sharded_preference_loss(sm, static_cast<const Model*>(nullptr), even, o, true);
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::fabs(want.loss));
    EXPECT_NEAR(got.rewards_margins, want.rewards_margins, 1e-5);
    pol.visit_params("", [&](std::string_view name, auto& p) {
      if (p.frozen) return;
      const auto g = sm.gather_grad(std::string(name));
      double num = 0, den = 0;
      for (std::int64_t i = 0; i < p.numel(); ++i) {
        num += (g.data()[i] - p.grad_data()[i]) * (g.data()[i] - p.grad_data()[i]);
        den += static_cast<double>(p.grad_data()[i]) * p.grad_data()[i];
      }
      EXPECT_LE(std::sqrt(num), 1e-4 * std::sqrt(den) + 1e-9) << name;
    });
  }
}

// On a mesh (fsdp=2, tp=2, dp x sp): the policy's per-position NLLs and weighted backward come
// from models::ShardedLlama; the loss, metrics and every gathered gradient equal one device's.
TEST(Preference, OnAMeshTheLossAndGradientsEqualOneDevice) {
  const Model ref = model(1);
  const Batch b = [] {
    Batch x = pairs().batch();
    pad_to_multiple(x, 2, 0);  // sp=2 splits the sequence
    return x;
  }();
  for (const bool orpo : {false, true})
    for (const std::array<std::int64_t, 4> dims : {std::array<std::int64_t, 4>{1, 2, 1, 1}, {1, 1, 2, 1}, {2, 1, 1, 2}}) {
      PreferenceOptions o;
      o.beta = 0.3;
      o.orpo = orpo;
      Model one = model(2);
      nn::zero_grad(one);
      const PreferenceMetrics want = preference_loss(one, ref, b, o, true);
      Model host = model(2);
      auto sm = models::shard_model(host, create_mesh(dims));
      sm.zero_grad();
      const PreferenceMetrics got = sharded_preference_loss(sm, orpo ? nullptr : &ref, b, o, true);
      const std::string what = std::string(orpo ? "orpo" : "dpo") + " mesh " + std::to_string(dims[0]) +
                               std::to_string(dims[1]) + std::to_string(dims[2]) + std::to_string(dims[3]);
      EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::fabs(want.loss)) << what;
      EXPECT_NEAR(got.rewards_margins, want.rewards_margins, 1e-5) << what;
      EXPECT_NEAR(got.logps_chosen, want.logps_chosen, 1e-4) << what;
      int checked = 0;
      one.visit_params("", [&](std::string_view name, auto& p) {
        const auto g = sm.gather_grad(std::string(name));
        ASSERT_EQ(static_cast<std::int64_t>(g.size()), p.numel()) << name;
        double num = 0, den = 0;
        for (std::int64_t i = 0; i < p.numel(); ++i) {
          const double d = g.data()[i] - p.grad_data()[i];
          num += d * d;
          den += static_cast<double>(p.grad_data()[i]) * p.grad_data()[i];
        }
        EXPECT_LE(std::sqrt(num), 1e-4 * std::sqrt(den) + 1e-9) << what << " " << name;
        ++checked;
      });
      EXPECT_GT(checked, 10);
    }
}

// Against PyTorch (scripts/preference_reference.py, tests/data/preference): the tiny_hf policy
// against a reference of moved weights on three pairs; DPO's sigmoid loss with label
// smoothing, IPO and ORPO, as TRL computes them in float64: loss, rewards and every gradient.
TEST(Preference, LossesAndGradientsEqualThePyTorchReference) {
  const char* env = std::getenv("EDL_TEST_DATA");
  const std::filesystem::path data = env ? env : "tests/data";
  const std::filesystem::path dir = data / "preference";
  ASSERT_TRUE(std::filesystem::exists(dir / "orpo_grads.safetensors")) << "no fixture at " << dir;
  const auto reference = models::from_pretrained((dir / "reference").string());
  const auto tokens = io::load_npy<std::int64_t>((dir / "tokens.npy").string());
  const auto labels = io::load_npy<std::int64_t>((dir / "labels.npy").string());
  Batch b;
  b.batch = static_cast<std::int64_t>(tokens.shape()[0]);
  b.seq = static_cast<std::int64_t>(tokens.shape()[1]);
  b.input_ids.assign(tokens.begin(), tokens.end());
  b.labels.assign(labels.begin(), labels.end());
  b.attention_mask.assign(b.input_ids.size(), 1);
  for (const char* name : {"dpo_sigmoid", "ipo", "orpo"}) {
    nlohmann::json want;
    std::ifstream((dir / (std::string(name) + ".json")).string()) >> want;
    PreferenceOptions o;
    o.beta = want["beta"].get<double>();
    o.label_smoothing = want["label_smoothing"].get<double>();
    o.loss_type = std::string(name) == "ipo" ? "ipo" : "sigmoid";
    o.orpo = std::string(name) == "orpo";
    auto policy = models::from_pretrained((data / "tiny_hf").string());
    nn::zero_grad(policy);
    const PreferenceMetrics m = o.orpo ? preference_loss(policy, b, o, true) : preference_loss(policy, reference, b, o, true);
    EXPECT_NEAR(m.loss, want["loss"].get<double>(), 1e-5 * std::fabs(want["loss"].get<double>())) << name;
    EXPECT_NEAR(m.rewards_chosen, want["rewards/chosen"].get<double>(), 1e-5) << name;
    EXPECT_NEAR(m.rewards_margins, want["rewards/margins"].get<double>(), 1e-5) << name;
    EXPECT_EQ(m.rewards_accuracies, want["rewards/accuracies"].get<double>()) << name;
    if (o.orpo) {
      EXPECT_NEAR(m.nll_loss, want["nll_loss"].get<double>(), 1e-5) << name;
      EXPECT_NEAR(m.log_odds_ratio, want["log_odds_ratio"].get<double>(), 1e-5) << name;
    }
    const auto grads = io::SafeTensorsFile::open((dir / (std::string(name) + "_grads.safetensors")).string());
    int checked = 0;
    policy.visit_params("", [&](std::string_view pname, auto& p) {
      const auto w = grads.read_vector<float>(std::string(pname));
      ASSERT_EQ(static_cast<std::int64_t>(w.size()), p.numel()) << pname;
      float scale = 0, err = 0;
      for (std::int64_t i = 0; i < p.numel(); ++i) {
        scale = std::max(scale, std::fabs(w[static_cast<std::size_t>(i)]));
        err = std::max(err, std::fabs(w[static_cast<std::size_t>(i)] - p.grad_data()[i]));
      }
      EXPECT_LE(err, 1e-4f * scale + 1e-7f) << name << " " << pname;
      ++checked;
    });
    EXPECT_EQ(checked, 21);
  }
}

TEST(Preference, GradientsEqualFiniteDifferences) {
  const Model ref = model(1);
  for (const char* type : {"sigmoid", "ipo", "orpo"}) {
    Model pol = model(2);
    PreferenceOptions o;
    o.loss_type = std::string(type) == "orpo" ? "sigmoid" : type;
    o.orpo = std::string(type) == "orpo";
    o.beta = 0.3;
    o.label_smoothing = std::string(type) == "sigmoid" ? 0.1 : 0.0;
    const Batch b = pairs().batch();
    nn::zero_grad(pol);
    preference_loss(pol, ref, b, o, true);
    int checked = 0;
    pol.visit_params("", [&](std::string_view name, auto& prm) {
      // A few entries of each kind of parameter: embedding, attention, MLP, norms, head.
      for (std::int64_t i : {std::int64_t{3}, prm.numel() / 2, prm.numel() - 1}) {
        float* v = prm.data() + i;
        const float keep = *v, h = 4e-3f;
        *v = keep + h;
        const double up = preference_loss(pol, ref, b, o, false).loss;
        *v = keep - h;
        const double down = preference_loss(pol, ref, b, o, false).loss;
        *v = keep;
        const double fd = (up - down) / (2.0 * h), g = prm.grad_data()[i];
        EXPECT_NEAR(g, fd, 2e-3 * std::fabs(fd) + 2e-4) << type << " " << name << "[" << i << "]";
        ++checked;
      }
    });
    EXPECT_GT(checked, 30);
  }
}

namespace {
namespace fs = std::filesystem;

/// A folder with eight {"prompt", "chosen", "rejected"} records, a byte-level tokenizer, and
/// training arguments for a tiny model on them.
struct PairsRun {
  fs::path dir;
  nlohmann::ordered_json args;
  explicit PairsRun(const std::string& trainer) {
    dir = fs::temp_directory_path() / ("edl_" + trainer + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream out((dir / "pairs.jsonl").string());
    for (int i = 0; i < 8; ++i)
      out << nlohmann::json{{"prompt", "say " + std::to_string(i) + ":"},
                            {"chosen", " yes " + std::to_string(i)},
                            {"rejected", " no"}}.dump()
          << "\n";
    out.close();
    tokenizer::byte_level_tokenizer().save(dir.string());
    args = {{"trainer", trainer}, {"beta", 0.5},
            {"model", {{"vocab_size", 259}, {"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 2}, {"max_position_embeddings", 64}}},
            {"tokenizer", (dir / "tokenizer.json").string()}, {"train_data", (dir / "pairs.jsonl").string()},
            {"save_directory", (dir / "run").string()}, {"total_batch_size", 4}, {"max_sequence_length", 32},
            {"max_training_steps", 30}, {"learning_rate", 3e-3}, {"log_steps", 1}, {"progress", false},
            {"write_report", false}, {"peak_gflops", 100}, {"sharding_axis_dims", {1, 1, 1, 1}}};
  }
  ~PairsRun() { fs::remove_all(dir); }
  std::vector<nlohmann::json> metrics(const std::string& run = "run") const {
    std::vector<nlohmann::json> out;
    std::ifstream in((dir / run / "metrics.jsonl").string());
    std::string l;
    while (std::getline(in, l)) out.push_back(nlohmann::json::parse(l));
    return out;
  }
};

}  // namespace

// DPO through the trainer ("trainer": "dpo"): pairs from {"prompt", "chosen", "rejected"}
// records, the reference is the starting policy, so the first step's loss is log 2 and its
// rewards 0; TRL's metric names in metrics.jsonl; the margins grow and the loss falls.
TEST(Preference, TheTrainerOptimisesPreferencePairs) {
  PairsRun run("dpo");
  const fs::path dir = run.dir;
  auto& args = run.args;
  const TokenDataset ds = load_preference_dataset({(dir / "pairs.jsonl").string()}, tokenizer::byte_level_tokenizer(), {});
  ASSERT_EQ(ds.size(), 16);
  EXPECT_EQ(ds.scored(1).size(), std::string("say 0: no").size());
  Trainer t(TrainingArguments::from_json(args));
  const auto r = t.train();
  const std::vector<nlohmann::json> lines = run.metrics();
  ASSERT_GE(lines.size(), 30u);
  EXPECT_NEAR(lines.front()["loss"].get<double>(), std::log(2.0), 1e-9);
  for (const char* k : {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                        "logps/rejected"})
    ASSERT_TRUE(lines.front().contains(k)) << k;
  EXPECT_EQ(lines.front()["rewards/margins"].get<double>(), 0.0);
  EXPECT_GT(lines[29]["rewards/margins"].get<double>(), 0.5);
  EXPECT_LT(r.final_loss, 0.5 * std::log(2.0));

  // Stopped after 10 steps and resumed: the reference is the starting policy again (not the
  // checkpoint), so the resumed run's losses and margins are the uninterrupted run's, exactly.
  args["save_directory"] = (dir / "resumed").string();
  {
    Trainer first(TrainingArguments::from_json(args));
    TrainerCallback stop;
    stop.on_step_end = [](Trainer&, const StepMetrics& m) { return m.step < 10; };
    first.callbacks.push_back(stop);
    EXPECT_EQ(first.train().steps, 10);
  }
  Trainer second(TrainingArguments::from_json(args));
  EXPECT_TRUE(second.train().resumed);
  const std::vector<nlohmann::json> again = run.metrics("resumed");
  ASSERT_EQ(again.size(), lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(again[i]["loss"], lines[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(again[i]["rewards/margins"], lines[i]["rewards/margins"]) << "step " << i + 1;
  }
}

// DPO through the trainer on fsdp = 2 and dp x fsdp = 2 x 2 meshes: the policy and its
// reference are built straight into the blocks (no host copy), the one-device losses within f32
// rounding; with eval_data, TRL's eval_ metrics at each evaluation scored on the mesh (batches
// padded to what it splits) equal one device's (at step 0 the reference is the policy: log 2).
TEST(Preference, TheTrainerRunsDpoOnAMeshAndEvaluatesPairs) {
  PairsRun run("dpo_mesh");
  run.args["max_training_steps"] = 10;
  run.args["trainer"] = "dpo";
  run.args["eval_data"] = (run.dir / "pairs.jsonl").string();
  run.args["evaluation_steps"] = 5;
  run.args["eval_batch_size"] = 3;  // batches of 3, 3 and 2 pairs: 6 rows are padded to 8 on dp x fsdp = 4
  const auto one = Trainer(TrainingArguments::from_json(run.args)).train();
  std::map<int, nlohmann::json> one_evals;
  for (const auto& j : run.metrics())
    if (j.contains("eval_logps/chosen")) one_evals[j["step"].get<int>()] = j;
  ASSERT_EQ(one_evals.size(), 2u);
  for (const std::vector<std::int64_t>& dims : {std::vector<std::int64_t>{1, 2, 1, 1}, {2, 2, 1, 1}}) {
    const std::string name = "mesh" + std::to_string(dims[0] * dims[1]);
    SCOPED_TRACE(name);
    run.args["sharding_axis_dims"] = dims;
    run.args["save_directory"] = (run.dir / name).string();
    Trainer t(TrainingArguments::from_json(run.args));
    EXPECT_EQ(t.mesh_devices(), dims[0] * dims[1]);
    EXPECT_FALSE(t.host_holds_model());  // the policy and its reference are built in the blocks
    const EvalMetrics before = t.evaluate();
    EXPECT_NEAR(before.loss, std::log(2.0), 1e-9);
    const auto mesh = t.train();
    EXPECT_FALSE(t.host_holds_model());  // trained and evaluated on the mesh alone
    EXPECT_NEAR(mesh.first_loss, one.first_loss, 1e-9);
    EXPECT_NEAR(mesh.final_loss, one.final_loss, 1e-3 * one.final_loss);
    int evals = 0;
    for (const auto& j : run.metrics(name))
      if (j.contains("eval_rewards/margins") && j["step"].get<int>() > 0) {
        ++evals;
        const auto& want = one_evals.at(j["step"].get<int>());
        for (const char* k : {"eval_loss", "eval_logps/chosen", "eval_logps/rejected", "eval_rewards/margins"})
          EXPECT_NEAR(j[k].get<double>(), want[k].get<double>(), 1e-3 * std::fabs(want[k].get<double>()) + 1e-6) << k;
        EXPECT_EQ(j["eval_pairs"], want["eval_pairs"]);
        EXPECT_GT(j["eval_rewards/margins"].get<double>(), 0.0);
      }
    EXPECT_EQ(evals, 2);
  }
}

// ORPO through the trainer: no reference model, TRL's ORPO metrics; the log odds of the chosen
// completion rise and the loss falls.
TEST(Preference, TheTrainerRunsOrpo) {
  PairsRun run("orpo");
  run.args["beta"] = 0.2;
  const auto r = Trainer(TrainingArguments::from_json(run.args)).train();
  const std::vector<nlohmann::json> lines = run.metrics();
  ASSERT_GE(lines.size(), 30u);
  for (const char* k : {"rewards/chosen", "rewards/margins", "logps/chosen", "nll_loss", "log_odds_ratio",
                        "log_odds_chosen"})
    ASSERT_TRUE(lines.front().contains(k)) << k;
  EXPECT_NEAR(lines.front()["loss"].get<double>(),
              lines.front()["nll_loss"].get<double>() - 0.2 * lines.front()["log_odds_ratio"].get<double>(), 1e-9);
  EXPECT_GT(lines[29]["log_odds_chosen"].get<double>(), lines.front()["log_odds_chosen"].get<double>() + 1.0);
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  run.args["reference_model"] = run.dir.string();  // ORPO has none
  EXPECT_THROW(TrainingArguments::from_json(run.args).validate(), Error);
}

// DPO with LoRA adapters: the reference is the base (adapters switched off), so the first step
// is log 2 as with a copy, and the adapters learn the preference.
TEST(Preference, TheTrainerRunsDpoOnLoraAdapters) {
  PairsRun run("dpo");
  run.args["lora"] = {{"r", 4}, {"lora_alpha", 16}, {"target_modules", {"q_proj", "v_proj", "up_proj", "down_proj"}}};
  run.args["learning_rate"] = 1e-2;
  const auto r = Trainer(TrainingArguments::from_json(run.args)).train();
  const std::vector<nlohmann::json> lines = run.metrics();
  ASSERT_GE(lines.size(), 30u);
  EXPECT_NEAR(lines.front()["loss"].get<double>(), std::log(2.0), 1e-9);
  EXPECT_EQ(lines.front()["rewards/margins"].get<double>(), 0.0);
  EXPECT_GT(lines[29]["rewards/margins"].get<double>(), 0.2);
  EXPECT_LT(r.final_loss, std::log(2.0));
}

}  // namespace edl::train
