// edl/train/training_arguments.hpp
// TrainingArguments: the trainer's configuration, read from JSON with EasyDeL's field names
// (docs/training.md lists every field, its default and its meaning).
//
//   auto a = edl::train::TrainingArguments::from_file("train.json");
//   a.apply_override("max_training_steps=10");          // `edl train --set key=value`
//   a.validate();
//
// Errors: errc::config with where = "<source> field <name>": an unknown field (every unknown
// field is named), a wrong type ("expected an integer, found "32" (string)"), an out-of-range
// value; errc::unsupported for valid EasyDeL settings this build does not implement
// (a mesh larger than one device, bf16 parameters, gradient checkpointing).
#pragma once

#include <array>
#include <cctype>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/io/json_config.hpp>
#include <edl/lora/config.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/schedule.hpp>
#include <edl/train/metrics.hpp>
#include <edl/train/preference_options.hpp>

namespace edl::train {

using ojson = nlohmann::ordered_json;

/// "90", "90s", "30m", "2h", "1h30m", "1d" -> seconds. Throws errc::config naming `where`.
inline double parse_duration(const std::string& s, const std::string& where) {
  auto fail = [&]() -> double {
    ::edl::detail::raise(errc::config, where,
                         "expected seconds or a duration like \"90s\", \"30m\", \"2h\", \"1h30m\"; found \"" + s + "\"");
  };
  if (s.empty()) return fail();
  double total = 0;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
    if (j == i) return fail();
    double v = 0;
    try { v = std::stod(s.substr(i, j - i)); } catch (...) { return fail(); }
    double unit = 1;
    if (j < s.size()) {
      switch (s[j]) {
        case 's': unit = 1; break;
        case 'm': unit = 60; break;
        case 'h': unit = 3600; break;
        case 'd': unit = 86400; break;
        default: return fail();
      }
      ++j;
    } else if (i != 0) {
      return fail();  // "1h30" is ambiguous
    }
    total += v * unit;
    i = j;
  }
  return total;
}

struct TrainingArguments {
  // ------------------------------------------------------------------ EasyDeL names
  std::string model_name = "edl-model";
  double learning_rate = 5e-5;
  double learning_rate_end = 0.0;        // rate reached at the last step (linear, cosine, WSD)
  std::string optimizer = "adamw";       // adamw | sgd | lion | adafactor
  std::string scheduler = "none";        // none | linear | cosine | warmup_stable_decay
  std::int64_t warmup_steps = 0;
  double weight_decay = 0.01;
  double clip_grad = 0.0;                // global-norm clipping; 0 (or null): off
  std::int64_t total_batch_size = 32;    // sequences per optimizer step
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t max_sequence_length = 4096;
  std::int64_t num_train_epochs = 10;
  std::optional<std::int64_t> max_training_steps;  // overrides num_train_epochs when set
  std::optional<double> training_time_limit;        // seconds (JSON: number or "30m" / "2h")
  std::optional<std::int64_t> evaluation_steps;     // evaluate every N steps (and at the end)
  std::optional<std::int64_t> max_evaluation_steps; // eval micro-batches per evaluation (null: all)
  std::optional<std::int64_t> save_steps;           // checkpoint every N steps (and at the end)
  std::optional<std::int64_t> save_total_limit;     // keep the newest N checkpoints (+ the best)
  bool async_checkpointing = false;                  // checkpoints written by a background thread while training goes on
  std::int64_t log_steps = 10;
  std::string save_directory = "EasyDeL-Checkpoints";
  std::string truncation_mode = "keep_end";         // keep_start | keep_end
  bool shuffle_train_dataset = true;
  bool resume_if_possible = true;
  // ------------------------------------------------------------------ ours
  double b1 = 0.9, b2 = 0.999, epsilon = 1e-8;
  double momentum = 0.0;                             // sgd, rmsprop
  double rmsprop_alpha = 0.99;                       // rmsprop: the squared gradients' decay (torch's alpha)
  bool rmsprop_centered = false;                     // rmsprop: centered (torch's centered)
  std::uint64_t seed = 42;
  std::vector<std::int64_t> sharding_axis_dims = {1, -1, 1, 1};
  std::vector<std::string> sharding_axis_names = {"dp", "fsdp", "tp", "sp"};
  std::string gradient_checkpointing = "";          // remat policy: ""/none, nothing_saveable, dots_saveable, ... (remat::runtime_names)
  std::string dtype = "float32";
  std::string param_dtype = "float32";
  double peak_gflops = 0.0;                          // MFU denominator; 0: measured at start
  bool progress = true;                              // the progress line on stderr
  std::string progress_bar_type = "tqdm";            // tqdm | rich (a bar), json (JSON lines), none
  bool write_report = true;                          // report.md / report.html at the end of train()
  std::int64_t weight_distribution_log_steps = 0;    // weights.jsonl every N steps; 0: off
  bool track_memory = false;                         // metrics.jsonl lines add the process's resident memory
  bool use_tensorboard = false;                      // every metrics line's numbers also as TensorBoard scalars (save_directory/tensorboard)
  std::optional<std::int64_t> report_steps;          // TensorBoard's training scalars every N steps, over those steps; none: at each metrics line
  /// Folder with config.json (+ model.safetensors), a preset name ("tiny", "small", "gqa1b")
  /// or an object of LlamaConfig fields.
  ojson model = "tiny";
  std::vector<std::string> train_data;
  std::vector<std::string> eval_data;
  /// "byte", a tokenizer.json path, {"train_bpe": vocab_size} or its spelled-out form
  /// {"type": "bpe", "vocab_size": N} (both train a byte-level BPE on the text of train_data),
  /// or {"type": "byte"}.
  ojson tokenizer = "byte";
  /// LoRA: adapters on these Linears are trained, everything else is frozen (docs/lora.md).
  /// JSON: {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora"} (PEFT's names).
  std::optional<lora::LoraConfig> lora;
  /// QLoRA: the base's Linears quantized (nf4, q4_0 or q8_0) before the adapters are added.
  std::string quantize_base;
  /// "causal_lm" (every token of the documents is a target) or "sft" (supervised fine-tuning
  /// on prompt/completion or conversation records, docs/fine_tuning.md), "dpo" or "orpo"
  /// (preference pairs, train/preference.hpp).
  std::string trainer = "causal_lm";
  /// SFT: the loss scores completions / assistant turns only (TRL's default); false: every token.
  bool completion_only_loss = true;
  /// Packing with document boundaries (TRL's names): sft packs its records into full rows of
  /// max_sequence_length (best-fit decreasing), causal_lm keeps the documents of its packed
  /// stream apart (they end at eos); either way attention never crosses a document and the
  /// positions restart at each. false: sft has one record per row, causal_lm's documents
  /// attend to the ones before them in the stream.
  bool packing = false;
  /// Each micro-batch's sequences side by side in one row, no padding (sft and causal_lm,
  /// with packing off): the same losses as a padded batch without computing the padding.
  bool padding_free = false;
  /// Sequences (or preference pairs) per evaluation batch; 0: the training micro-batch.
  std::int64_t eval_batch_size = 0;
  /// DPO and ORPO (train/preference.hpp, TRL's names): the loss, its beta and label smoothing,
  /// and DPO's frozen reference model (a folder; empty: the policy's base when it trains LoRA
  /// adapters, else a copy of the initial policy).
  std::string loss_type = "sigmoid";
  double beta = 0.1;
  double label_smoothing = 0.0;
  std::string reference_model;
  /// The causal-LM loss (EasyDeL's loss_config; causal_lm and sft): z-loss coefficient on
  /// lse^2, label smoothing in [0, 1), and logits rows live at once (chunk_token_size).
  struct LossConfig {
    double z_loss = 0.0;
    double label_smoothing = 0.0;
    std::int64_t chunk_token_size = 1024;
    bool operator==(const LossConfig&) const = default;
  } loss_config;

  std::string source = "TrainingArguments";

  /// A preference trainer (dpo or orpo): the data holds (chosen, rejected) pairs.
  bool preference() const noexcept { return trainer == "dpo" || trainer == "orpo"; }
  PreferenceOptions preference_options() const { return {loss_type, beta, label_smoothing, trainer == "orpo"}; }

  /// The optimizer the fields name (optimizer, b1, b2, epsilon, weight_decay, momentum, rmsprop_*).
  optim::OptimizerOptions optimizer_options() const {
    optim::OptimizerOptions o;
    o.kind = optim::optimizer_from_name(optimizer);
    o.b1 = b1;
    o.b2 = b2;
    o.eps = epsilon;
    o.weight_decay = weight_decay;
    o.momentum = momentum;
    o.rmsprop_alpha = rmsprop_alpha;
    o.rmsprop_centered = rmsprop_centered;
    return o;
  }
  /// Sets those fields from `o` (a training state's optimizer becomes the run's).
  void set_optimizer(const optim::OptimizerOptions& o) {
    optimizer = optim::optimizer_name(o.kind);
    b1 = o.b1;
    b2 = o.b2;
    epsilon = o.eps;
    weight_decay = o.weight_decay;
    momentum = o.momentum;
    rmsprop_alpha = o.rmsprop_alpha;
    rmsprop_centered = o.rmsprop_centered;
  }
  /// The learning-rate schedule the fields name, over `total_steps` optimizer steps.
  optim::Schedule schedule(std::int64_t total_steps) const {
    optim::Schedule s;
    s.kind = optim::schedule_from_name(scheduler);
    s.lr = learning_rate;
    s.lr_end = learning_rate_end;
    s.warmup_steps = warmup_steps;
    s.total_steps = total_steps;
    return s;
  }

  static const std::vector<std::string>& field_names() {
    static const std::vector<std::string> n = {
        "model_name", "learning_rate", "learning_rate_end", "optimizer", "scheduler", "warmup_steps",
        "weight_decay", "clip_grad", "total_batch_size", "gradient_accumulation_steps", "max_sequence_length",
        "num_train_epochs", "max_training_steps", "training_time_limit", "evaluation_steps",
        "max_evaluation_steps", "save_steps", "save_total_limit", "async_checkpointing", "log_steps", "save_directory",
        "truncation_mode", "shuffle_train_dataset", "resume_if_possible", "b1", "b2", "epsilon", "momentum",
        "rmsprop_alpha", "rmsprop_centered", "seed", "sharding_axis_dims", "sharding_axis_names", "gradient_checkpointing", "dtype", "param_dtype",
        "peak_gflops", "progress", "progress_bar_type", "write_report", "weight_distribution_log_steps", "track_memory", "use_tensorboard", "report_steps", "model", "train_data", "eval_data", "tokenizer",
        "lora", "quantize_base", "trainer", "completion_only_loss", "packing", "padding_free", "eval_batch_size", "loss_type", "beta", "label_smoothing",
        "reference_model", "loss_config"};
    return n;
  }

  std::string where(const std::string& field) const { return source + " field " + field; }

  /// Reads every known field (missing: default); unknown fields are an error naming all of them.
  static TrainingArguments from_json(const ojson& j, const std::string& source = "TrainingArguments") {
    EDL_CHECK(j.is_object(), errc::config, source, "expected a JSON object, found ", j.type_name());
    TrainingArguments a;
    a.source = source;
    const std::set<std::string> known(field_names().begin(), field_names().end());
    std::string unknown;
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!known.count(it.key())) unknown += (unknown.empty() ? "\"" : ", \"") + it.key() + "\"";
    EDL_CHECK(unknown.empty(), errc::config, source, "unknown field(s) ", unknown,
              "; see docs/training.md for the TrainingArguments fields");
    for (auto it = j.begin(); it != j.end(); ++it) a.set_field(it.key(), it.value());
    return a;
  }

  static TrainingArguments from_file(const std::string& path) {
    auto c = io::JsonConfig::from_file(path);
    return from_json(c.json(), path);
  }

  /// Sets one field from JSON (type-checked; errors name the field).
  void set_field(const std::string& key, const ojson& v) {
    const std::string w = where(key);
    auto str = [&](std::string& dst) { dst = io::JsonConfig::convert<std::string>(v, w); };
    auto i64 = [&](std::int64_t& dst) { dst = io::JsonConfig::convert<std::int64_t>(v, w); };
    auto f64 = [&](double& dst) { dst = io::JsonConfig::convert<double>(v, w); };
    auto boo = [&](bool& dst) { dst = io::JsonConfig::convert<bool>(v, w); };
    auto oi64 = [&](std::optional<std::int64_t>& dst) {
      if (v.is_null()) dst.reset(); else dst = io::JsonConfig::convert<std::int64_t>(v, w);
    };
    auto files = [&](std::vector<std::string>& dst) {
      if (v.is_null()) dst.clear();
      else if (v.is_string()) dst = {v.get<std::string>()};
      else dst = io::JsonConfig::convert<std::vector<std::string>>(v, w);
    };
    if (key == "model_name") str(model_name);
    else if (key == "learning_rate") f64(learning_rate);
    else if (key == "learning_rate_end") { if (v.is_null()) learning_rate_end = 0; else f64(learning_rate_end); }
    else if (key == "optimizer") str(optimizer);
    else if (key == "scheduler") str(scheduler);
    else if (key == "warmup_steps") i64(warmup_steps);
    else if (key == "weight_decay") f64(weight_decay);
    else if (key == "clip_grad") { if (v.is_null()) clip_grad = 0; else f64(clip_grad); }
    else if (key == "total_batch_size") i64(total_batch_size);
    else if (key == "gradient_accumulation_steps") i64(gradient_accumulation_steps);
    else if (key == "max_sequence_length") i64(max_sequence_length);
    else if (key == "num_train_epochs") i64(num_train_epochs);
    else if (key == "max_training_steps") oi64(max_training_steps);
    else if (key == "training_time_limit") {
      if (v.is_null()) training_time_limit.reset();
      else if (v.is_string()) training_time_limit = parse_duration(v.get<std::string>(), w);
      else if (v.is_number()) training_time_limit = v.get<double>();
      else ::edl::detail::raise(errc::config, w, "expected seconds (a number) or a string like \"30m\", found " +
                                                     v.dump() + " (" + v.type_name() + ")");
    }
    else if (key == "evaluation_steps") oi64(evaluation_steps);
    else if (key == "max_evaluation_steps") oi64(max_evaluation_steps);
    else if (key == "save_steps") oi64(save_steps);
    else if (key == "save_total_limit") oi64(save_total_limit);
    else if (key == "async_checkpointing") boo(async_checkpointing);
    else if (key == "log_steps") i64(log_steps);
    else if (key == "save_directory") str(save_directory);
    else if (key == "truncation_mode") str(truncation_mode);
    else if (key == "shuffle_train_dataset") boo(shuffle_train_dataset);
    else if (key == "resume_if_possible") boo(resume_if_possible);
    else if (key == "b1") f64(b1);
    else if (key == "b2") f64(b2);
    else if (key == "epsilon") f64(epsilon);
    else if (key == "momentum") f64(momentum);
    else if (key == "rmsprop_alpha") f64(rmsprop_alpha);
    else if (key == "rmsprop_centered") boo(rmsprop_centered);
    else if (key == "seed") seed = io::JsonConfig::convert<std::uint64_t>(v, w);
    else if (key == "sharding_axis_dims") sharding_axis_dims = io::JsonConfig::convert<std::vector<std::int64_t>>(v, w);
    else if (key == "sharding_axis_names") sharding_axis_names = io::JsonConfig::convert<std::vector<std::string>>(v, w);
    else if (key == "gradient_checkpointing") {
      if (v.is_null()) gradient_checkpointing = "";
      // true as in HF (gradient_checkpointing=True recomputes each layer): nothing_saveable.
      else if (v.is_boolean()) gradient_checkpointing = v.get<bool>() ? "nothing_saveable" : "";
      else str(gradient_checkpointing);
    }
    else if (key == "dtype") str(dtype);
    else if (key == "param_dtype") str(param_dtype);
    else if (key == "peak_gflops") { if (v.is_null()) peak_gflops = 0; else f64(peak_gflops); }
    else if (key == "progress") boo(progress);
    else if (key == "write_report") boo(write_report);
    else if (key == "weight_distribution_log_steps") i64(weight_distribution_log_steps);
    else if (key == "model") {
      EDL_CHECK(v.is_string() || v.is_object(), errc::config, w,
                "expected a folder, a preset name or an object of LlamaConfig fields, found ", v.dump(), " (",
                v.type_name(), ")");
      model = v;
    }
    else if (key == "trainer") str(trainer);
    else if (key == "completion_only_loss") { if (v.is_null()) completion_only_loss = true; else boo(completion_only_loss); }
    else if (key == "packing") { if (v.is_null()) packing = false; else boo(packing); }
    else if (key == "padding_free") { if (v.is_null()) padding_free = false; else boo(padding_free); }
    else if (key == "track_memory") { if (v.is_null()) track_memory = false; else boo(track_memory); }
    else if (key == "use_tensorboard") boo(use_tensorboard);
    else if (key == "report_steps") oi64(report_steps);
    else if (key == "eval_batch_size") eval_batch_size = v.is_null() ? 0 : io::JsonConfig::convert<std::int64_t>(v, w);
    else if (key == "loss_type") str(loss_type);
    else if (key == "beta") f64(beta);
    else if (key == "label_smoothing") f64(label_smoothing);
    else if (key == "progress_bar_type") str(progress_bar_type);
    else if (key == "loss_config") {
      loss_config = LossConfig{};
      if (!v.is_null()) {
        EDL_CHECK(v.is_object(), errc::config, w,
                  "expected an object {\"z_loss\", \"label_smoothing\", \"chunk_token_size\"} or null, found ", v.dump());
        for (auto it = v.begin(); it != v.end(); ++it) {
          const std::string f = w + "." + it.key();
          if (it.key() == "z_loss") loss_config.z_loss = io::JsonConfig::convert<double>(*it, f);
          else if (it.key() == "label_smoothing") loss_config.label_smoothing = io::JsonConfig::convert<double>(*it, f);
          else if (it.key() == "chunk_token_size") loss_config.chunk_token_size = io::JsonConfig::convert<std::int64_t>(*it, f);
          else ::edl::detail::raise(errc::config, w, "unknown field \"" + it.key() + "\"; expected z_loss, label_smoothing, chunk_token_size");
        }
      }
    }
    else if (key == "reference_model") { if (v.is_null()) reference_model.clear(); else str(reference_model); }
    else if (key == "train_data") files(train_data);
    else if (key == "eval_data") files(eval_data);
    else if (key == "tokenizer") {
      // The spelled-out spec is stored in its short form, so the rest of the code sees one
      // spelling ("byte" or {"train_bpe": N}).
      ojson t = v;
      if (v.is_object() && v.contains("type") && v["type"].is_string()) {
        const std::string type = v["type"].get<std::string>();
        if (type == "byte" && v.size() == 1) t = "byte";
        else if (type == "bpe" && v.size() == 2 && v.contains("vocab_size") && v["vocab_size"].is_number_integer())
          t = ojson{{"train_bpe", v["vocab_size"]}};
      }
      const bool ok = t.is_string() || (t.is_object() && t.size() == 1 && t.contains("train_bpe") &&
                                         t["train_bpe"].is_number_integer());
      EDL_CHECK(ok, errc::config, w,
                "expected \"byte\", a tokenizer.json path, {\"type\": \"bpe\", \"vocab_size\": N} or "
                "{\"train_bpe\": N}, found ", v.dump(), " (", v.type_name(), ")");
      tokenizer = t;
    }
    else if (key == "lora") {
      if (v.is_null()) {
        lora.reset();
      } else {
        EDL_CHECK(v.is_object(), errc::config, w, "expected an object {\"r\", \"lora_alpha\", \"lora_dropout\", "
                  "\"target_modules\", \"use_rslora\"} or null, found ", v.dump());
        static const std::set<std::string> fields = {"r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora",
                                                     "bias", "use_dora"};
        for (auto it = v.begin(); it != v.end(); ++it)
          EDL_CHECK(fields.count(it.key()), errc::config, w, "unknown field \"", it.key(),
                    "\"; expected r, lora_alpha, lora_dropout, target_modules, use_rslora");
        lora = lora::from_peft_json(v, w);
      }
    }
    else if (key == "quantize_base") {
      if (v.is_null()) quantize_base.clear(); else str(quantize_base);
    }
    else ::edl::detail::raise(errc::config, source, "unknown field \"" + key + "\"");
  }

  /// "key=value": value parsed as JSON, or taken as a string when it is not valid JSON
  /// (so --set save_directory=out works without quotes).
  void apply_override(const std::string& kv) {
    const auto eq = kv.find('=');
    EDL_CHECK(eq != std::string::npos && eq > 0, errc::config, "--set", "expected key=value, found \"", kv, "\"");
    const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    const std::set<std::string> known(field_names().begin(), field_names().end());
    EDL_CHECK(known.count(key), errc::config, "--set", "unknown field \"", key, "\"");
    ojson v;
    try { v = ojson::parse(val); } catch (...) { v = val; }
    set_field(key, v);
  }

  /// Ranges and combinations; errors name the field.
  void validate() const {
    auto positive = [&](const char* f, double v) { EDL_CHECK(v > 0, errc::config, where(f), "must be positive, found ", v); };
    auto nonneg = [&](const char* f, double v) { EDL_CHECK(v >= 0, errc::config, where(f), "must be >= 0, found ", v); };
    EDL_CHECK(optimizer == "adamw" || optimizer == "sgd" || optimizer == "lion" || optimizer == "adafactor" ||
                  optimizer == "rmsprop",
              errc::config, where("optimizer"), "expected one of adamw, sgd, lion, adafactor, rmsprop; found \"", optimizer,
              "\"");
    EDL_CHECK(rmsprop_alpha >= 0 && rmsprop_alpha <= 1, errc::config, where("rmsprop_alpha"), "must lie in [0, 1], found ",
              rmsprop_alpha);
    EDL_CHECK(scheduler == "none" || scheduler == "linear" || scheduler == "cosine" ||
                  scheduler == "warmup_stable_decay",
              errc::config, where("scheduler"), "expected one of none, linear, cosine, warmup_stable_decay; found \"",
              scheduler, "\"");
    progress_style_from_name(progress_bar_type, where("progress_bar_type"));
    EDL_CHECK(loss_config.z_loss >= 0, errc::config, where("loss_config.z_loss"), "must be >= 0, found ", loss_config.z_loss);
    EDL_CHECK(loss_config.label_smoothing >= 0 && loss_config.label_smoothing < 1, errc::config,
              where("loss_config.label_smoothing"), "must lie in [0, 1), found ", loss_config.label_smoothing);
    EDL_CHECK(loss_config.chunk_token_size > 0, errc::config, where("loss_config.chunk_token_size"),
              "must be positive, found ", loss_config.chunk_token_size);
    EDL_CHECK(!preference() || loss_config == LossConfig{}, errc::unsupported, where("loss_config"),
              "applies to the causal_lm and sft trainers; ", trainer, " has its own loss (loss_type, beta, label_smoothing)");
    EDL_CHECK(truncation_mode == "keep_start" || truncation_mode == "keep_end", errc::config, where("truncation_mode"),
              "expected keep_start or keep_end, found \"", truncation_mode, "\"");
    nonneg("learning_rate", learning_rate);
    nonneg("learning_rate_end", learning_rate_end);
    nonneg("warmup_steps", static_cast<double>(warmup_steps));
    nonneg("weight_decay", weight_decay);
    nonneg("clip_grad", clip_grad);
    positive("total_batch_size", static_cast<double>(total_batch_size));
    positive("gradient_accumulation_steps", static_cast<double>(gradient_accumulation_steps));
    EDL_CHECK(total_batch_size % gradient_accumulation_steps == 0, errc::config, where("gradient_accumulation_steps"),
              "total_batch_size (", total_batch_size, ") must be divisible by gradient_accumulation_steps (",
              gradient_accumulation_steps, ")");
    EDL_CHECK(max_sequence_length >= 2, errc::config, where("max_sequence_length"), "must be >= 2, found ",
              max_sequence_length);
    positive("num_train_epochs", static_cast<double>(num_train_epochs));
    if (max_training_steps) positive("max_training_steps", static_cast<double>(*max_training_steps));
    if (training_time_limit) positive("training_time_limit", *training_time_limit);
    if (evaluation_steps) positive("evaluation_steps", static_cast<double>(*evaluation_steps));
    if (max_evaluation_steps) positive("max_evaluation_steps", static_cast<double>(*max_evaluation_steps));
    if (save_steps) positive("save_steps", static_cast<double>(*save_steps));
    if (report_steps) positive("report_steps", static_cast<double>(*report_steps));
    if (save_total_limit) positive("save_total_limit", static_cast<double>(*save_total_limit));
    positive("log_steps", static_cast<double>(log_steps));
    EDL_CHECK(!save_directory.empty(), errc::config, where("save_directory"), "must not be empty");
    nonneg("peak_gflops", peak_gflops);
    nonneg("weight_distribution_log_steps", static_cast<double>(weight_distribution_log_steps));
    EDL_CHECK(sharding_axis_dims.size() == sharding_axis_names.size(), errc::config, where("sharding_axis_dims"),
              "has ", sharding_axis_dims.size(), " entries but sharding_axis_names has ", sharding_axis_names.size());
    (void)mesh_dims();  // names and sizes are checked there
    {
      const auto m = mesh_dims();
      const std::int64_t data = m[0] * m[1] * m[2];
      EDL_CHECK(micro_batch_size() % data == 0, errc::config, where("total_batch_size"),
                "the micro-batch of ", micro_batch_size(), " sequences (total_batch_size ", total_batch_size,
                " / gradient_accumulation_steps ", gradient_accumulation_steps,
                ") must divide by the data-parallel size dp x fsdp x ep = ", data);
      EDL_CHECK(max_sequence_length % m[4] == 0, errc::config, where("max_sequence_length"), max_sequence_length,
                " must divide by the sequence-parallel size sp = ", m[4]);
      EDL_CHECK(!padding_free || (data == 1 && m[4] == 1), errc::unsupported, where("padding_free"),
                "a padding-free micro-batch is one row of any length, which the dp, fsdp, ep and sp axes cannot split; "
                "use packing on such a mesh");
    }
    remat::parse(gradient_checkpointing, where("gradient_checkpointing"), errc::config);
    (void)compute_storage();
    (void)param_storage();
    EDL_CHECK(!train_data.empty(), errc::config, where("train_data"), "missing: give a file or a list of files");
    EDL_CHECK(trainer == "causal_lm" || trainer == "sft" || trainer == "dpo" || trainer == "orpo", errc::config,
              where("trainer"), "expected causal_lm, sft, dpo or orpo, found \"", trainer, "\"");
    EDL_CHECK(eval_batch_size >= 0, errc::config, where("eval_batch_size"), "must be 0 (the micro-batch) or positive, found ",
              eval_batch_size);
    EDL_CHECK(!(packing && padding_free), errc::config, where("padding_free"),
              "packing already fills each row; padding_free applies with packing off");
    EDL_CHECK(!preference() || (!packing && !padding_free), errc::unsupported, where(packing ? "packing" : "padding_free"),
              trainer, " keeps each pair's rows apart: packing and padding_free apply to causal_lm and sft");
    if (preference()) {
      preference_options().validate(source + " field");
      EDL_CHECK(trainer != "orpo" || reference_model.empty(), errc::config, where("reference_model"),
                "orpo uses no reference model; found \"", reference_model, "\"");
    }
    if (!quantize_base.empty()) {
      EDL_CHECK(quantize_base == "nf4" || quantize_base == "q4_0" || quantize_base == "q8_0", errc::config,
                where("quantize_base"), "expected nf4, q4_0 or q8_0, found \"", quantize_base, "\"");
      EDL_CHECK(lora.has_value(), errc::config, where("quantize_base"),
                "a quantized base is frozen: QLoRA needs a \"lora\" section to train adapters over it");
      EDL_CHECK(mesh_devices() == 1, errc::unsupported, where("quantize_base"),
                "QLoRA runs on one device for now (a model on a mesh holds float weights; LoRA over a float base "
                "runs on any mesh); found a mesh of ", mesh_devices(), " devices");
    }
    if (lora) lora->validate(where("lora"));
  }

  /// The mesh {dp, fsdp, ep, tp, sp} of sharding_axis_dims / sharding_axis_names. Names are
  /// EasyDeL's axes, each at most once, in any order; an axis not named is 1. -1 (at most
  /// once) takes the devices left over, as in EasyDeL: of device_count(), one per process or
  /// MPI rank unless EDL_DEVICES says how many.
  MeshDims mesh_dims() const {
    static constexpr std::array<const char*, 5> kAxes = {"dp", "fsdp", "ep", "tp", "sp"};
    EDL_CHECK(sharding_axis_dims.size() == sharding_axis_names.size(), errc::config, where("sharding_axis_dims"),
              "has ", sharding_axis_dims.size(), " entries but sharding_axis_names has ", sharding_axis_names.size());
    MeshDims dims = {1, 1, 1, 1, 1};
    std::array<bool, 5> seen = {false, false, false, false, false};
    for (std::size_t i = 0; i < sharding_axis_names.size(); ++i) {
      const std::string& n = sharding_axis_names[i];
      std::size_t a = 0;
      while (a < kAxes.size() && n != kAxes[a]) ++a;
      EDL_CHECK(a < kAxes.size(), errc::config, where("sharding_axis_names"), "unknown axis \"", n,
                "\", expected dp, fsdp, ep, tp or sp");
      EDL_CHECK(!seen[a], errc::config, where("sharding_axis_names"), "axis ", n, " is named twice");
      seen[a] = true;
      const std::int64_t d = sharding_axis_dims[i];
      EDL_CHECK(d == -1 || d >= 1, errc::config, where("sharding_axis_dims"), "the size of axis ", n,
                " must be positive (or -1), found ", d);
      dims[a] = d;
    }
    return infer_mesh_dims(dims, -1, where("sharding_axis_dims"), errc::config);
  }
  /// The parameters' storage param_dtype names: f32, or bf16 / f16 for mixed precision
  /// (BF16Trainer, F16Trainer: f32 master weights in the optimizer). Throws for other names.
  DType param_storage() const { return float_dtype_named(param_dtype, "param_dtype"); }
  /// The compute dtype `dtype` names (the activations' type, Policy's Compute): f32, or bf16 /
  /// f16 activations with f32 accumulation (docs/modules.md, "Compute dtype"). Throws for
  /// other names.
  DType compute_storage() const { return float_dtype_named(dtype, "dtype"); }
  /// float32 / bfloat16 / float16 (and their short names) as a DType; `field` names the
  /// argument in the error.
  DType float_dtype_named(const std::string& p, const char* field) const {
    if (p == "float32" || p == "fp32" || p == "f32") return DType::f32;
    if (p == "bfloat16" || p == "bf16") return DType::bf16;
    if (p == "float16" || p == "fp16" || p == "f16" || p == "half") return DType::f16;
    ::edl::detail::raise(errc::unsupported, where(field),
                         "expected float32, bfloat16 (bf16) or float16 (fp16), found \"" + p + "\"");
  }
  std::int64_t mesh_devices() const {
    const auto d = mesh_dims();
    return d[0] * d[1] * d[2] * d[3] * d[4];
  }

  /// Mini-batch size: total_batch_size / gradient_accumulation_steps.
  std::int64_t micro_batch_size() const { return total_batch_size / gradient_accumulation_steps; }
  /// Sequences (pairs) per evaluation batch: eval_batch_size, else the micro-batch.
  std::int64_t eval_batch() const { return eval_batch_size > 0 ? eval_batch_size : micro_batch_size(); }

  ojson to_json() const {
    ojson j = ojson::object();
    auto opt = [](const auto& o) -> ojson { return o ? ojson(*o) : ojson(nullptr); };
    j["model_name"] = model_name;
    j["learning_rate"] = learning_rate;
    j["learning_rate_end"] = learning_rate_end;
    j["optimizer"] = optimizer;
    j["scheduler"] = scheduler;
    j["warmup_steps"] = warmup_steps;
    j["weight_decay"] = weight_decay;
    j["clip_grad"] = clip_grad;
    j["total_batch_size"] = total_batch_size;
    j["gradient_accumulation_steps"] = gradient_accumulation_steps;
    j["max_sequence_length"] = max_sequence_length;
    j["num_train_epochs"] = num_train_epochs;
    j["max_training_steps"] = opt(max_training_steps);
    j["training_time_limit"] = opt(training_time_limit);
    j["evaluation_steps"] = opt(evaluation_steps);
    j["max_evaluation_steps"] = opt(max_evaluation_steps);
    j["save_steps"] = opt(save_steps);
    j["save_total_limit"] = opt(save_total_limit);
    j["async_checkpointing"] = async_checkpointing;
    j["log_steps"] = log_steps;
    j["save_directory"] = save_directory;
    j["truncation_mode"] = truncation_mode;
    j["shuffle_train_dataset"] = shuffle_train_dataset;
    j["resume_if_possible"] = resume_if_possible;
    j["b1"] = b1;
    j["b2"] = b2;
    j["epsilon"] = epsilon;
    j["momentum"] = momentum;
    j["rmsprop_alpha"] = rmsprop_alpha;
    j["rmsprop_centered"] = rmsprop_centered;
    j["seed"] = seed;
    j["sharding_axis_dims"] = sharding_axis_dims;
    j["sharding_axis_names"] = sharding_axis_names;
    j["gradient_checkpointing"] = gradient_checkpointing;
    j["dtype"] = dtype;
    j["param_dtype"] = param_dtype;
    j["peak_gflops"] = peak_gflops;
    j["progress"] = progress;
    j["write_report"] = write_report;
    j["weight_distribution_log_steps"] = weight_distribution_log_steps;
    j["model"] = model;
    j["train_data"] = train_data;
    j["eval_data"] = eval_data;
    j["tokenizer"] = tokenizer;
    j["lora"] = lora ? lora::to_json(*lora) : ojson(nullptr);
    j["quantize_base"] = quantize_base.empty() ? ojson(nullptr) : ojson(quantize_base);
    j["trainer"] = trainer;
    j["completion_only_loss"] = completion_only_loss;
    j["packing"] = packing;
    j["padding_free"] = padding_free;
    j["track_memory"] = track_memory;
    j["use_tensorboard"] = use_tensorboard;
    j["report_steps"] = opt(report_steps);
    j["eval_batch_size"] = eval_batch_size;
    j["loss_type"] = loss_type;
    j["beta"] = beta;
    j["label_smoothing"] = label_smoothing;
    j["reference_model"] = reference_model.empty() ? ojson(nullptr) : ojson(reference_model);
    j["progress_bar_type"] = progress_bar_type;
    j["loss_config"] = {{"z_loss", loss_config.z_loss},
                        {"label_smoothing", loss_config.label_smoothing},
                        {"chunk_token_size", loss_config.chunk_token_size}};
    return j;
  }
};

}  // namespace edl::train
