// edl/generate/generation_config.hpp
// GenerationConfig: the fields of HF generation_config.json that edl's generate() honours, with
// HF's defaults (transformers.GenerationConfig), plus presence_penalty, seed and stop tokens.
//
//   auto g = edl::generate::GenerationConfig::from_file("ckpt/generation_config.json");
//   g.max_new_tokens = 32;
//
// Unknown fields are ignored (HF writes many: transformers_version, ...). A mistyped or out of
// range value is errc::config naming the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/io/json_config.hpp>
#include <edl/models/llama/config.hpp>

namespace edl::generate {

/// HF early_stopping: true, false (the heuristic) or "never".
enum class EarlyStopping { heuristic, yes, never };

struct GenerationConfig {
  bool do_sample = false;
  float temperature = 1.0f;
  std::int64_t top_k = 50;      // 0: off (HF default 50, used only when sampling)
  float top_p = 1.0f;           // 1: off
  float min_p = 0.0f;           // 0: off
  float repetition_penalty = 1.0f;  // 1: off (HF CTRL penalty over prompt + generated tokens)
  float presence_penalty = 0.0f;    // 0: off (OpenAI / vLLM: minus this for every generated token seen)
  float frequency_penalty = 0.0f;   // 0: off (OpenAI / vLLM: minus this times the token's count in the output)
  float typical_p = 1.0f;           // 1: off (locally typical sampling, HF TypicalLogitsWarper)
  std::int64_t no_repeat_ngram_size = 0;  // 0: off (no n-gram of this size occurs twice in prompt + output)
  std::vector<std::vector<std::int64_t>> bad_words_ids;  // token sequences never completed
  std::int64_t min_length = 0;       // 0: off (no stop token while prompt + output is shorter)
  std::int64_t min_new_tokens = 0;   // 0: off (no stop token before this many new tokens)
  std::vector<std::int64_t> suppress_tokens;        // never generated
  std::vector<std::int64_t> begin_suppress_tokens;  // not generated as the first new token
  std::int64_t max_new_tokens = 20;
  std::vector<std::int64_t> eos_token_id;  // stop tokens from the model (int or list in JSON)
  std::vector<std::int64_t> stop_token_ids;  // more stop tokens (edl)
  std::optional<std::int64_t> pad_token_id;
  std::int64_t num_beams = 1;
  std::int64_t num_return_sequences = 1;  // sequences per prompt (sampled ones differ; greedy ones repeat; beam search: its best n, n <= num_beams)
  float length_penalty = 1.0f;
  EarlyStopping early_stopping = EarlyStopping::heuristic;
  std::uint64_t seed = 0;

  /// Greedy unless do_sample (HF: do_sample false means argmax after the processors).
  bool greedy() const noexcept { return !do_sample; }

  bool is_stop(std::int64_t tok) const noexcept {
    for (auto e : eos_token_id)
      if (e == tok) return true;
    for (auto e : stop_token_ids)
      if (e == tok) return true;
    return false;
  }

  /// Checks every field; with vocab_size > 0 also that the token ids it names are in [0, vocab_size).
  void validate(const std::string& source = "GenerationConfig", std::int64_t vocab_size = 0) const {
    const auto where = [&](const char* f) { return source + " field " + f; };
    EDL_CHECK(typical_p > 0 && typical_p <= 1, errc::config, where("typical_p"), "must be in (0, 1], found ", typical_p);
    EDL_CHECK(no_repeat_ngram_size >= 0, errc::config, where("no_repeat_ngram_size"), "must be >= 0, found ",
              no_repeat_ngram_size);
    EDL_CHECK(min_length >= 0, errc::config, where("min_length"), "must be >= 0, found ", min_length);
    EDL_CHECK(min_new_tokens >= 0, errc::config, where("min_new_tokens"), "must be >= 0, found ", min_new_tokens);
    const auto check_ids = [&](const char* f, const std::vector<std::int64_t>& ids) {
      for (const std::int64_t t : ids)
        EDL_CHECK(t >= 0 && (vocab_size <= 0 || t < vocab_size), errc::config, where(f), "token id ", t,
                  vocab_size > 0 ? " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")" : " is negative");
    };
    for (const auto& w : bad_words_ids) {
      EDL_CHECK(!w.empty(), errc::config, where("bad_words_ids"), "holds an empty token sequence");
      check_ids("bad_words_ids", w);
    }
    check_ids("suppress_tokens", suppress_tokens);
    check_ids("begin_suppress_tokens", begin_suppress_tokens);
    EDL_CHECK(temperature > 0, errc::config, where("temperature"), "must be positive, found ", temperature);
    EDL_CHECK(top_k >= 0, errc::config, where("top_k"), "must be >= 0, found ", top_k);
    EDL_CHECK(top_p > 0 && top_p <= 1, errc::config, where("top_p"), "must be in (0, 1], found ", top_p);
    EDL_CHECK(min_p >= 0 && min_p <= 1, errc::config, where("min_p"), "must be in [0, 1], found ", min_p);
    EDL_CHECK(repetition_penalty > 0, errc::config, where("repetition_penalty"), "must be positive, found ",
              repetition_penalty);
    EDL_CHECK(std::isfinite(presence_penalty), errc::config, where("presence_penalty"), "must be finite, found ",
              presence_penalty);
    EDL_CHECK(std::isfinite(frequency_penalty), errc::config, where("frequency_penalty"), "must be finite, found ",
              frequency_penalty);
    EDL_CHECK(max_new_tokens >= 0, errc::config, where("max_new_tokens"), "must be >= 0, found ", max_new_tokens);
    EDL_CHECK(num_beams >= 1, errc::config, where("num_beams"), "must be >= 1, found ", num_beams);
    EDL_CHECK(num_return_sequences >= 1, errc::config, where("num_return_sequences"), "must be >= 1, found ",
              num_return_sequences);
    EDL_CHECK(num_beams == 1 || num_return_sequences <= num_beams, errc::config, where("num_return_sequences"),
              "beam search returns at most its num_beams (", num_beams, ") best beams, asked for ",
              num_return_sequences);
  }

  /// Reads an HF generation_config.json object; missing fields keep the defaults above.
  static GenerationConfig from_json(const nlohmann::ordered_json& j, const std::string& source = "GenerationConfig") {
    const io::JsonConfig c(j, source);
    GenerationConfig g;
    g.do_sample = c.get<bool>("do_sample", g.do_sample);
    g.temperature = static_cast<float>(c.get<double>("temperature", g.temperature));
    g.top_k = c.get<std::int64_t>("top_k", g.top_k);
    g.top_p = static_cast<float>(c.get<double>("top_p", g.top_p));
    g.min_p = static_cast<float>(c.get<double>("min_p", g.min_p));
    g.repetition_penalty = static_cast<float>(c.get<double>("repetition_penalty", g.repetition_penalty));
    g.presence_penalty = static_cast<float>(c.get<double>("presence_penalty", g.presence_penalty));
    g.frequency_penalty = static_cast<float>(c.get<double>("frequency_penalty", g.frequency_penalty));
    g.max_new_tokens = c.get<std::int64_t>("max_new_tokens", g.max_new_tokens);
    g.typical_p = static_cast<float>(c.get<double>("typical_p", g.typical_p));
    g.no_repeat_ngram_size = c.get<std::int64_t>("no_repeat_ngram_size", g.no_repeat_ngram_size);
    if (c.has_value("bad_words_ids"))
      g.bad_words_ids = c.get<std::vector<std::vector<std::int64_t>>>("bad_words_ids");
    g.min_length = c.get<std::int64_t>("min_length", g.min_length);
    g.min_new_tokens = c.get<std::int64_t>("min_new_tokens", g.min_new_tokens);
    if (c.has_value("suppress_tokens")) g.suppress_tokens = c.get<std::vector<std::int64_t>>("suppress_tokens");
    if (c.has_value("begin_suppress_tokens"))
      g.begin_suppress_tokens = c.get<std::vector<std::int64_t>>("begin_suppress_tokens");
    if (c.has_value("eos_token_id")) {
      if (j["eos_token_id"].is_array()) g.eos_token_id = c.get<std::vector<std::int64_t>>("eos_token_id");
      else g.eos_token_id = {c.get<std::int64_t>("eos_token_id")};
    }
    g.pad_token_id = c.optional<std::int64_t>("pad_token_id");
    g.num_beams = c.get<std::int64_t>("num_beams", g.num_beams);
    g.num_return_sequences = c.get<std::int64_t>("num_return_sequences", g.num_return_sequences);
    g.length_penalty = static_cast<float>(c.get<double>("length_penalty", g.length_penalty));
    if (c.has_value("early_stopping")) {
      const auto& e = j["early_stopping"];
      if (e.is_boolean()) g.early_stopping = e.get<bool>() ? EarlyStopping::yes : EarlyStopping::heuristic;
      else {
        EDL_CHECK(e.is_string() && e.get<std::string>() == "never", errc::config, c.where("early_stopping"),
                  "expected true, false or \"never\", found ", e.dump());
        g.early_stopping = EarlyStopping::never;
      }
    }
    g.seed = static_cast<std::uint64_t>(c.get<std::int64_t>("seed", 0));
    g.validate(source);
    return g;
  }

  static GenerationConfig from_file(const std::string& path) {
    const io::JsonConfig c = io::JsonConfig::from_file(path);
    return from_json(c.json(), path);
  }

  /// Defaults from a model config: its eos and pad tokens.
  static GenerationConfig from_model_config(const models::LlamaConfig& m) {
    GenerationConfig g;
    g.eos_token_id = m.eos_token_id;
    g.pad_token_id = m.pad_token_id;
    return g;
  }

  /// What a model folder says to generate with: its generation_config.json where it has one
  /// (eos tokens the file leaves out come from the model config, as transformers does), else
  /// the model config's defaults (from_model_config).
  static GenerationConfig from_folder(const std::filesystem::path& dir, const models::LlamaConfig& m) {
    const std::filesystem::path file = dir / "generation_config.json";
    if (!std::filesystem::exists(file)) return from_model_config(m);
    GenerationConfig g = from_file(file.string());
    if (g.eos_token_id.empty()) g.eos_token_id = m.eos_token_id;
    return g;
  }
};

}  // namespace edl::generate
