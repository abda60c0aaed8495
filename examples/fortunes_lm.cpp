// The main job of README: train a small byte-level Llama on a real corpus (Debian's fortunes,
// plain-text files whose entries are separated by lines holding only "%"), then generate.
//
//   edl_example_fortunes_lm [--steps N] [--out DIR] [--corpus DIR] [--seed S]
//
// Everything here is the library: LlamaForCausalLM with its hand-derived backward, the chunked
// loss, AdamW with a warm-up + cosine schedule and global-norm clipping, the counter-based RNG
// (batches and sampling are reproducible), safetensors + config.json in HF's layout. It prints
// one JSON line per logged step (step, loss, learning_rate, grad_norm, tokens_per_s), then the
// generated text, then a final JSON summary; the model is saved to --out (an HF folder).
#include <edl/edl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace edl;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kBos = 256, kEos = 257, kVocab = 258;  // bytes, then two specials

// Fortunes as one token stream: each entry's bytes, then eos.
std::vector<std::int64_t> load_corpus(const fs::path& dir, std::size_t& entries) {
  std::vector<std::int64_t> tokens;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // a fixed order: the same stream on every machine
  EDL_CHECK(!files.empty(), errc::io, dir.string(), "no fortune files (install Debian's fortunes package)");
  entries = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string line, entry;
    auto flush = [&] {
      if (entry.empty()) return;
      for (unsigned char c : entry) tokens.push_back(c);
      tokens.push_back(kEos);
      entry.clear();
      ++entries;
    };
    while (std::getline(in, line)) {
      if (line == "%") flush();
      else entry += line + "\n";
    }
    flush();
  }
  return tokens;
}

std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return fallback;
}

// Samples from softmax(logits / temperature) restricted to the top_k largest, with the
// counter-based RNG: the draw at step t depends only on (key, t).
std::int64_t sample(const float* logits, std::int64_t vocab, float temperature, int top_k, Key key, std::uint64_t t) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(vocab));
  for (std::int64_t i = 0; i < vocab; ++i) ids[static_cast<std::size_t>(i)] = i;
  std::partial_sort(ids.begin(), ids.begin() + top_k, ids.end(),
                    [&](std::int64_t a, std::int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> p(static_cast<std::size_t>(top_k));
  double sum = 0;
  for (int i = 0; i < top_k; ++i) sum += p[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / temperature);
  double u = uniform_at(key, t) * sum;
  for (int i = 0; i < top_k; ++i)
    if ((u -= p[i]) <= 0) return ids[i];
  return ids[0];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::int64_t steps = std::stoll(flag(argc, argv, "steps", "300"));
    const fs::path out = flag(argc, argv, "out", "fortunes_lm");
    const fs::path corpus = flag(argc, argv, "corpus", "/usr/share/games/fortunes");
    const Key key = Key::from_seed(std::stoull(flag(argc, argv, "seed", "0")));

    std::size_t entries = 0;
    const auto stream = load_corpus(corpus, entries);
    // Hold out the last 5% of the stream for evaluation.
    const std::int64_t split = static_cast<std::int64_t>(stream.size()) * 95 / 100;

    models::LlamaConfig cfg;
    cfg.vocab_size = kVocab;
    cfg.hidden_size = 128;
    cfg.intermediate_size = 384;
    cfg.num_hidden_layers = 4;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 4;
    cfg.head_dim = 32;
    cfg.max_position_embeddings = 512;
    cfg.bos_token_id = kBos;
    cfg.eos_token_id = {kEos};
    cfg.validate();
    models::LlamaForCausalLM<> model(cfg);
    model.init(fold_in(key, 1));

    const std::int64_t batch = 16, seq = 128;
    optim::OptimizerOptions oo;
    oo.b1 = 0.9, oo.b2 = 0.95, oo.weight_decay = 0.1;
    optim::Optimizer opt(oo);
    const optim::Schedule sched{optim::ScheduleKind::cosine, 3e-3, 3e-4, std::min<std::int64_t>(30, steps / 10), steps};

    std::printf("{\"corpus\":\"%s\",\"entries\":%zu,\"tokens\":%zu,\"params\":%lld,\"batch\":%lld,\"seq\":%lld,\"steps\":%lld}\n",
                corpus.string().c_str(), entries, stream.size(), static_cast<long long>(model.param_count()),
                static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(steps));
    std::fflush(stdout);

    // A batch: windows starting at counter-based random offsets (step s, row b).
    std::vector<std::int64_t> ids(static_cast<std::size_t>(batch * seq));
    auto fill_batch = [&](Key k, std::int64_t s, std::int64_t lo, std::int64_t hi) {
      for (std::int64_t b = 0; b < batch; ++b) {
        const auto start = lo + static_cast<std::int64_t>(random_bits_at(fold_in(k, static_cast<std::uint32_t>(s)),
                                                                          static_cast<std::uint64_t>(b)) %
                                                          static_cast<std::uint64_t>(hi - lo - seq));
        std::copy_n(stream.begin() + start, seq, ids.begin() + b * seq);
      }
    };
    const nn::TokenLayout layout{batch, seq};
    const auto t_start = std::chrono::steady_clock::now();
    double first_loss = 0, last_loss = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      fill_batch(fold_in(key, 2), s, 0, split);
      optim::zero_grad(model);
      const auto m = model.forward_backward(ids.data(), layout);
      EDL_CHECK(std::isfinite(m.loss), errc::invalid_argument, "training", "loss became ", m.loss, " at step ", s);
      const double gnorm = optim::clip_by_global_norm(model, 1.0);
      const double lr = sched.lr_at(s);
      opt.step(model, lr);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s == 0) first_loss = m.loss;
      last_loss = m.loss;
      if (s % 10 == 0 || s == steps - 1)
        std::printf("{\"step\":%lld,\"loss\":%.4f,\"learning_rate\":%.3g,\"grad_norm\":%.3f,\"tokens_per_s\":%.0f}\n",
                    static_cast<long long>(s), m.loss, lr, gnorm, static_cast<double>(batch * seq) / dt);
      std::fflush(stdout);
    }
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    // Held-out loss on 4 batches of the last 5%.
    double eval = 0;
    for (int e = 0; e < 4; ++e) {
      fill_batch(fold_in(key, 3), e, split, static_cast<std::int64_t>(stream.size()));
      eval += model.loss(ids.data(), layout).loss / 4;
    }

    // Save in HF's layout: config.json + model.safetensors.
    fs::create_directories(out);
    cfg.save((out / "config.json").string());
    io::TensorList tensors;
    std::vector<std::vector<float>> keep;
    model.visit_params("", [&](std::string_view path, auto& p) {
      tensors.emplace_back(std::string(path), io::TensorRef(std::span<const float>(p.data(), p.value.size()), p.shape()));
    });
    io::save_safetensors((out / "model.safetensors").string(), tensors, {{"format", "pt"}});

    // Generate: sample 300 bytes after a prompt, recomputing the forward each step (a KV
    // cache is the generation layer's job).
    const std::string prompt = flag(argc, argv, "prompt", "Q: ");
    std::vector<std::int64_t> ctx;
    for (unsigned char c : prompt) ctx.push_back(c);
    std::string text = prompt;
    std::vector<float> logits;
    for (std::uint64_t t = 0; t < 300; ++t) {
      const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(ctx.size()), seq);
      const std::int64_t* window = ctx.data() + ctx.size() - n;
      logits.resize(static_cast<std::size_t>(n * kVocab));
      model.logits(window, nn::TokenLayout{1, n}, logits.data());
      const std::int64_t next = sample(logits.data() + (n - 1) * kVocab, kVocab, 0.8f, 20, fold_in(key, 4), t);
      if (next == kEos) break;
      ctx.push_back(next);
      if (next < 256) text += static_cast<char>(next);
    }
    std::printf("---- generated ----\n%s\n-------------------\n", text.c_str());
    std::printf("{\"steps\":%lld,\"first_loss\":%.4f,\"final_loss\":%.4f,\"eval_loss\":%.4f,\"train_seconds\":%.1f,"
                "\"tokens_per_s\":%.0f,\"checkpoint\":\"%s\"}\n",
                static_cast<long long>(steps), first_loss, last_loss, eval, train_s,
                static_cast<double>(steps * batch * seq) / train_s, out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fortunes_lm: %s\n", e.what());
    return 1;
  }
}
