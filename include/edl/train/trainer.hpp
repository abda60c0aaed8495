// edl/train/trainer.hpp
// The causal-LM trainer (EasyDeL's Trainer, on one device for now):
//
//   auto args = train::TrainingArguments::from_file("train.json");
//   train::Trainer t(args);              // model, tokenizer and data from the arguments
//   train::TrainerCallback cb;
//   cb.on_step_end = [](train::Trainer&, const train::StepMetrics& m) {
//     return m.loss > 1.0;               // false stops training (after this step)
//   };
//   t.callbacks.push_back(cb);
//   train::TrainResult r = t.train();    // resumes from the newest checkpoint if asked to
//
// One optimizer step: total_batch_size sequences (the next ones of the epoch's order) split
// into gradient_accumulation_steps micro-batches; every micro-batch's loss is divided by the
// number of target tokens of the whole step (LossOptions::normalizer), so the accumulated
// gradient is that of the mean loss over the step's tokens, whatever the split; then
// global-norm clipping (clip_grad > 0), the schedule's rate and the optimizer update.
// Every log_steps: a line in <save_directory>/metrics.jsonl and the progress line; every
// evaluation_steps: the mean loss and perplexity over eval_data; every save_steps and at the end:
// a checkpoint (checkpoint.hpp). A non-finite loss or gradient norm stops with errc::invalid_argument
// before the parameters change (the last checkpoint stays the last good one); training_time_limit
// stops cleanly after the current step, with a checkpoint. The final hidden states are checked
// for NaN/Inf before the loss (a NaN never reaches the loss kernel). gradient_checkpointing
// picks the remat policy of the step at run time (forward<R> of the one model type, Model):
// nothing_saveable, dots_saveable, ... trade step time for activation memory (docs/training.md).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/rng.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/loss.hpp>
#include <edl/optim/clip.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/schedule.hpp>
#include <edl/train/checkpoint.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/metrics.hpp>
#include <edl/train/tokenizer.hpp>
#include <edl/train/training_arguments.hpp>

namespace edl::train {

struct StepMetrics {
  std::int64_t step = 0;          // optimizer steps done, including this one
  std::int64_t epoch = 0;         // epoch this step's batch came from
  double loss = 0.0;              // mean loss over the step's target tokens
  double learning_rate = 0.0;
  double grad_norm = 0.0;         // before clipping
  std::int64_t tokens = 0;        // target tokens of the step
  double step_seconds = 0.0;
};

struct EvalMetrics {
  std::int64_t step = 0;
  double loss = 0.0;        // mean over target tokens
  double perplexity = 1.0;  // exp(loss)
  double accuracy = 0.0;
  std::int64_t tokens = 0;
};

struct TrainResult {
  std::int64_t steps = 0;              // optimizer steps done (total, across resumes)
  double first_loss = 0.0;             // first step of this session
  double final_loss = 0.0;             // last step
  std::optional<double> eval_loss;     // last evaluation
  double tokens_per_s = 0.0;           // this session
  double seconds = 0.0;                // this session
  std::string checkpoint;              // last checkpoint written (or resumed from)
  std::string stop_reason;             // "max_steps" | "time_limit" | "callback" | "nothing_to_do"
  bool resumed = false;
};

class Trainer;

/// User callbacks: any member may be empty. on_step_end returning false stops training.
struct TrainerCallback {
  std::function<void(Trainer&, std::int64_t step)> on_step_start;
  std::function<bool(Trainer&, const StepMetrics&)> on_step_end;
  std::function<void(Trainer&, const EvalMetrics&)> on_evaluate;
  std::function<void(Trainer&, const std::string& checkpoint)> on_save;
};

class Trainer {
 public:
  using Model = models::LlamaForCausalLM<>;

  /// Builds model, tokenizer and datasets from `args` (see docs/training.md).
  explicit Trainer(TrainingArguments args) : args_(std::move(args)) {
    args_.validate();
    build_tokenizer();
    build_model();
    DataOptions d{args_.max_sequence_length, eos_or(-1), model_->config().vocab_size};
    train_ = load_dataset(args_.train_data, tok_ ? &*tok_ : nullptr, d);
    if (!args_.eval_data.empty()) eval_ = load_dataset(args_.eval_data, tok_ ? &*tok_ : nullptr, d);
    finish_setup();
  }

  /// Explicit parts (programs and tests); `model` is used as given (no init, no loading).
  Trainer(TrainingArguments args, Model model, std::optional<ByteLevelBPE> tokenizer, TokenDataset train_data,
          std::optional<TokenDataset> eval_data = std::nullopt)
      : args_(std::move(args)),
        tok_(std::move(tokenizer)),
        model_(std::make_unique<Model>(std::move(model))),
        train_(std::move(train_data)),
        eval_(std::move(eval_data)) {
    if (args_.train_data.empty()) args_.train_data = {"<in memory>"};
    args_.validate();
    finish_setup();
  }

  virtual ~Trainer() = default;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  std::vector<TrainerCallback> callbacks;
  CheckpointHooks checkpoint_hooks;  // tests: fail a save midway

  /// Hooks for subclasses; the default calls the callbacks.
  virtual void on_step_start(std::int64_t step) {
    for (auto& c : callbacks)
      if (c.on_step_start) c.on_step_start(*this, step);
  }
  virtual void on_step_end(const StepMetrics& m) {
    for (auto& c : callbacks)
      if (c.on_step_end && !c.on_step_end(*this, m)) request_stop("callback");
  }

  void request_stop(std::string reason = "callback") {
    if (stop_reason_.empty()) stop_reason_ = std::move(reason);
  }

  Model& model() noexcept { return *model_; }
  optim::Optimizer& optimizer() noexcept { return opt_; }
  const TrainState& state() const noexcept { return state_; }
  const TrainingArguments& args() const noexcept { return args_; }
  const std::optional<ByteLevelBPE>& tokenizer() const noexcept { return tok_; }
  const TokenDataset& train_dataset() const noexcept { return train_; }
  const std::optional<TokenDataset>& eval_dataset() const noexcept { return eval_; }
  std::int64_t steps_per_epoch() const noexcept { return steps_per_epoch_; }
  std::int64_t total_steps() const noexcept { return total_steps_; }
  const optim::Schedule& schedule() const noexcept { return sched_; }
  CheckpointManager& checkpoints() noexcept { return ckpt_; }
  double peak_gflops() const noexcept { return peak_gflops_; }

  /// Mean loss / perplexity over eval_data (max_evaluation_steps micro-batches at most).
  EvalMetrics evaluate() {
    EvalMetrics e;
    e.step = state_.step;
    if (!eval_ || eval_->size() == 0) return e;
    const std::int64_t mb = args_.micro_batch_size();
    double ce = 0, hits = 0;
    std::int64_t batches = 0;
    for (std::int64_t lo = 0; lo < eval_->size(); lo += mb) {
      if (args_.max_evaluation_steps && batches >= *args_.max_evaluation_steps) break;
      std::vector<std::span<const std::int32_t>> seqs;
      for (std::int64_t i = lo; i < std::min(eval_->size(), lo + mb); ++i) seqs.push_back((*eval_)[i]);
      const Batch b = collate(seqs, args_.max_sequence_length, pad_id_, trunc_);
      const nn::LossMetrics m = guarded_loss(b, {}, /*backward=*/false);
      ce += m.loss * static_cast<double>(m.tokens);
      hits += m.accuracy * static_cast<double>(m.tokens);
      e.tokens += m.tokens;
      ++batches;
    }
    EDL_CHECK(std::isfinite(ce), errc::invalid_argument, "evaluation at step " + std::to_string(state_.step),
              "the eval loss is ", ce, " (the model's outputs are not finite)");
    if (e.tokens > 0) {
      e.loss = ce / static_cast<double>(e.tokens);
      e.accuracy = hits / static_cast<double>(e.tokens);
      e.perplexity = std::exp(e.loss);
    }
    last_eval_ = e;
    ojson j = ojson::object();
    j["step"] = e.step;
    j["eval_loss"] = e.loss;
    j["eval_perplexity"] = e.perplexity;
    j["eval_accuracy"] = e.accuracy;
    j["eval_tokens"] = e.tokens;
    metrics_->write(j);
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval at step %lld: loss %.4f, perplexity %.2f, accuracy %.3f",
                  static_cast<long long>(e.step), e.loss, e.perplexity, e.accuracy);
    progress_.message(buf);
    for (auto& c : callbacks)
      if (c.on_evaluate) c.on_evaluate(*this, e);
    return e;
  }

  /// Writes checkpoint-<step> now; returns its path.
  std::string save_checkpoint() {
    TrainState s = state_;
    s.eval_loss = (last_eval_ && last_eval_->step == state_.step) ? std::optional<double>(last_eval_->loss) : std::nullopt;
    s.training_arguments = args_.to_json();
    const std::string p = ckpt_.save(*model_, opt_, s, tok_ ? &*tok_ : nullptr, checkpoint_hooks);
    last_checkpoint_ = p;
    last_saved_step_ = state_.step;
    progress_.message("saved " + p);
    for (auto& c : callbacks)
      if (c.on_save) c.on_save(*this, p);
    return p;
  }

  /// Restores model, optimizer and position from a checkpoint folder.
  void resume_from(const std::string& dir) {
    state_ = load_state(dir, *model_, opt_);
    last_checkpoint_ = dir;
    last_saved_step_ = state_.step;
    resumed_ = true;
  }

  /// Runs until total_steps(), the time limit or a stop request.
  TrainResult train() {
    TrainResult r;
    ckpt_.remove_temporaries();
    if (args_.resume_if_possible && !resumed_)
      if (auto latest = ckpt_.latest()) {
        resume_from(*latest);
        progress_.message("resumed from " + *latest + " at step " + std::to_string(state_.step));
      }
    r.resumed = resumed_;
    stop_reason_.clear();
    if (peak_gflops_ <= 0) peak_gflops_ = measure_peak_gflops();
    const auto t_start = std::chrono::steady_clock::now();
    const double elapsed_before = state_.elapsed_s;
    const std::int64_t first_step = state_.step;
    auto session_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };

    std::vector<std::int64_t> order;
    std::int64_t order_epoch = -1;
    const std::int64_t B = args_.total_batch_size, A = args_.gradient_accumulation_steps, mb = args_.micro_batch_size();
    // Log window.
    double win_loss = 0, win_s = 0, win_flops = 0;
    std::int64_t win_steps = 0, win_tokens = 0, session_tokens = 0;
    std::vector<std::span<const std::int32_t>> seqs;

    while (state_.step < total_steps_ && stop_reason_.empty()) {
      on_step_start(state_.step);
      if (!stop_reason_.empty()) break;
      const auto t0 = std::chrono::steady_clock::now();
      if (order_epoch != state_.epoch) {
        order = epoch_order(train_.size(), state_.data_key, state_.epoch, args_.shuffle_train_dataset);
        order_epoch = state_.epoch;
      }
      // The step's micro-batches, then the step's number of target tokens.
      std::vector<Batch> micro;
      micro.reserve(static_cast<std::size_t>(A));
      std::int64_t targets = 0, input_tokens = 0;
      for (std::int64_t a = 0; a < A; ++a) {
        seqs.clear();
        for (std::int64_t i = 0; i < mb; ++i)
          seqs.push_back(train_[order[static_cast<std::size_t>(state_.batch_in_epoch * B + a * mb + i)]]);
        micro.push_back(collate(seqs, args_.max_sequence_length, pad_id_, trunc_));
        targets += micro.back().target_tokens();
        for (auto m : micro.back().attention_mask) input_tokens += m;
      }
      optim::zero_grad(*model_);
      nn::LossOptions lo;
      lo.normalizer = static_cast<double>(std::max<std::int64_t>(targets, 1));
      double loss = 0, flops = 0;
      for (const Batch& b : micro) {
        loss += guarded_loss(b, lo, /*backward=*/true).loss;
        flops += 3.0 * model_->flops_forward(b.batch, b.seq);
        if (!std::isfinite(loss)) break;
      }
      const std::string where = "train step " + std::to_string(state_.step + 1);
      const std::string keep = last_checkpoint_.empty() ? std::string("no checkpoint was written yet")
                                                        : "the last good checkpoint is " + last_checkpoint_;
      EDL_CHECK(std::isfinite(loss), errc::invalid_argument, where, "the loss is ", loss,
                "; training stopped before updating the parameters (", keep, ")");
      const double gnorm = optim::clip_by_global_norm(*model_, args_.clip_grad);
      EDL_CHECK(std::isfinite(gnorm), errc::invalid_argument, where, "the gradient norm is ", gnorm, " (loss ", loss,
                "); training stopped before updating the parameters (", keep, ")");
      const double lr = sched_.lr_at(state_.step);
      opt_.step(*model_, lr);

      StepMetrics sm;
      sm.epoch = state_.epoch;
      ++state_.step;
      if (++state_.batch_in_epoch >= steps_per_epoch_) {
        state_.batch_in_epoch = 0;
        ++state_.epoch;
      }
      state_.tokens_seen += targets;
      state_.optimizer_step_count = opt_.step_count();
      state_.last_loss = loss;
      state_.elapsed_s = elapsed_before + session_s();
      sm.step = state_.step;
      sm.loss = loss;
      sm.learning_rate = lr;
      sm.grad_norm = gnorm;
      sm.tokens = targets;
      sm.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (state_.step == first_step + 1) r.first_loss = loss;
      r.final_loss = loss;
      session_tokens += input_tokens;
      win_loss += loss;
      win_s += sm.step_seconds;
      win_flops += flops;
      win_tokens += input_tokens;
      ++win_steps;

      on_step_end(sm);
      const bool last = state_.step >= total_steps_;
      if (state_.step % args_.log_steps == 0 || state_.step == first_step + 1 || last || !stop_reason_.empty()) {
        const double tok_s = win_s > 0 ? static_cast<double>(win_tokens) / win_s : 0.0;
        const double mfu = (win_s > 0 && peak_gflops_ > 0) ? win_flops / win_s / (peak_gflops_ * 1e9) : 0.0;
        const double per_step = session_s() / static_cast<double>(state_.step - first_step);
        ojson j = ojson::object();
        j["step"] = state_.step;
        j["epoch"] = sm.epoch;
        j["loss"] = win_loss / static_cast<double>(win_steps);
        j["learning_rate"] = lr;
        j["grad_norm"] = gnorm;
        j["tokens_per_s"] = tok_s;
        j["mfu"] = mfu;
        j["elapsed_s"] = state_.elapsed_s;
        j["tokens_seen"] = state_.tokens_seen;
        metrics_->write(j);
        progress_.update(state_.step, total_steps_, win_loss / static_cast<double>(win_steps), lr, tok_s, mfu,
                         per_step * static_cast<double>(total_steps_ - state_.step));
        win_loss = win_s = win_flops = 0;
        win_steps = win_tokens = 0;
      }
      if (args_.evaluation_steps && eval_ && state_.step % *args_.evaluation_steps == 0) evaluate();
      if (args_.save_steps && state_.step % *args_.save_steps == 0) save_checkpoint();
      if (args_.training_time_limit && state_.elapsed_s >= *args_.training_time_limit) request_stop("time_limit");
    }
    if (state_.step == first_step && stop_reason_.empty()) {
      r.stop_reason = "nothing_to_do";
    } else {
      r.stop_reason = stop_reason_.empty() ? "max_steps" : stop_reason_;
      if (eval_ && (!last_eval_ || last_eval_->step != state_.step)) evaluate();
      if (last_saved_step_ != state_.step) save_checkpoint();
    }
    progress_.finish();
    r.steps = state_.step;
    r.seconds = session_s();
    r.tokens_per_s = r.seconds > 0 ? static_cast<double>(session_tokens) / r.seconds : 0.0;
    if (last_eval_) r.eval_loss = last_eval_->loss;
    r.checkpoint = last_checkpoint_;
    if (state_.step == first_step && state_.last_loss) r.final_loss = r.first_loss = *state_.last_loss;
    return r;
  }

 private:
  /// The model's forward_backward (or loss), with a finiteness check of the final hidden
  /// states before the loss: non-finite activations give loss NaN instead of reaching the
  /// loss kernel (whose argmax expects finite logits).
  nn::LossMetrics guarded_loss(const Batch& b, const nn::LossOptions& lo, bool backward) {
    const nn::TokenLayout lay{b.batch, b.seq, nullptr, b.attention_mask.data()};
    Model::Saved s;
    // The remat policy named by gradient_checkpointing (validated): the layers keep what it
    // saves and their backward recomputes the rest; loss and gradients are bitwise the same.
    remat::dispatch(args_.gradient_checkpointing,
                    [&]<class R>() { model_->template forward<R>(b.input_ids.data(), lay, s); });
    for (float v : s.hidden)
      if (!std::isfinite(v)) {
        nn::LossMetrics bad;
        bad.loss = std::numeric_limits<double>::quiet_NaN();
        return bad;
      }
    const auto& c = model_->config();
    std::vector<float> dhidden(backward ? s.hidden.size() : 0);
    const nn::LossMetrics m = nn::causal_lm_loss(s.hidden.data(), lay.batch, lay.seq, c.hidden_size,
                                                 model_->head_weight(), c.vocab_size, b.labels.data(), lo,
                                                 backward ? dhidden.data() : nullptr,
                                                 backward ? model_->head_grad() : nullptr);
    if (backward) model_->model.backward(dhidden.data(), s.model_s);
    return m;
  }

  std::int64_t eos_or(std::int64_t fallback) const {
    if (tok_ && tok_->eos_id()) return *tok_->eos_id();
    return fallback;
  }

  void build_tokenizer() {
    const ojson& t = args_.tokenizer;
    const std::string w = args_.where("tokenizer");
    if (t.is_null() || (t.is_string() && t.get<std::string>() == "none")) return;
    if (t.is_string() && t.get<std::string>() == "byte") {
      tok_ = ByteLevelBPE::byte_level();
    } else if (t.is_string()) {
      tok_ = ByteLevelBPE::from_file(t.get<std::string>());
    } else {  // {"train_bpe": vocab_size}: trained on the text of train_data, saved next to the checkpoints
      const std::string saved = (fs::path(args_.save_directory) / "tokenizer.json").string();
      if (args_.resume_if_possible && fs::exists(saved)) {
        tok_ = ByteLevelBPE::from_file(saved);
        return;
      }
      std::vector<std::string> docs;
      for (const auto& f : args_.train_data) {
        if (detail::ends_with(f, ".npy") || detail::ends_with(f, ".bin")) continue;
        auto d = detail::ends_with(f, ".jsonl") ? read_jsonl_documents(f) : read_text_documents(f);
        docs.insert(docs.end(), d.begin(), d.end());
      }
      EDL_CHECK(!docs.empty(), errc::config, w, "train_bpe needs text train_data (.jsonl or text files)");
      tok_ = ByteLevelBPE::train(docs, t["train_bpe"].get<std::int64_t>());
      fs::create_directories(args_.save_directory);
      tok_->save(saved);
    }
  }

  void build_model() {
    const ojson& m = args_.model;
    const std::string w = args_.where("model");
    models::LlamaConfig cfg;
    std::optional<std::string> weights_dir;
    bool from_folder = false;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      if (fs::is_directory(s)) {
        cfg = models::LlamaConfig::from_file((fs::path(s) / "config.json").string());
        from_folder = true;
        if (fs::exists(fs::path(s) / io::kSingleFileName) || fs::exists(fs::path(s) / io::kIndexFileName))
          weights_dir = s;
      } else {
        const auto names = models::LlamaConfig::preset_names();
        std::string valid;
        for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
        EDL_CHECK(std::find(names.begin(), names.end(), s) != names.end(), errc::config, w, "\"", s,
                  "\" is neither a folder with config.json nor a preset (", valid, ")");
        cfg = models::LlamaConfig::preset(s);
      }
    } else {
      cfg = models::LlamaConfig::from_json(m, w);
    }
    if (tok_ && !from_folder) {  // special ids of the tokenizer, unless the object names them
      if (!m.is_object() || !m.contains("bos_token_id")) cfg.bos_token_id = tok_->bos_id();
      if ((!m.is_object() || !m.contains("eos_token_id")) && tok_->eos_id()) cfg.eos_token_id = {*tok_->eos_id()};
      if (!m.is_object() || !m.contains("pad_token_id")) cfg.pad_token_id = tok_->pad_id();
    }
    cfg.validate();
    if (tok_)
      EDL_CHECK(cfg.vocab_size >= tok_->vocab_size(), errc::config, w + " vocab_size", "the tokenizer has ",
                tok_->vocab_size(), " tokens but the model's vocab_size is ", cfg.vocab_size);
    model_ = std::make_unique<Model>(cfg);
    if (weights_dir) load_model_weights(*weights_dir, *model_);
    else model_->init(fold_in(Key::from_seed(args_.seed), 0));
  }

  void finish_setup() {
    EDL_CHECK(train_.size() >= args_.total_batch_size, errc::config, args_.where("total_batch_size"),
              "the training data has ", train_.size(), " sequences of at most ", args_.max_sequence_length,
              " tokens, fewer than one batch of ", args_.total_batch_size);
    steps_per_epoch_ = train_.size() / args_.total_batch_size;  // the last partial batch is dropped
    total_steps_ = args_.max_training_steps ? *args_.max_training_steps : args_.num_train_epochs * steps_per_epoch_;
    trunc_ = truncation_from_name(args_.truncation_mode);
    pad_id_ = tok_ && tok_->pad_id() ? *tok_->pad_id() : (tok_ && tok_->eos_id() ? *tok_->eos_id() : 0);
    optim::OptimizerOptions oo;
    oo.kind = optim::optimizer_from_name(args_.optimizer);
    oo.b1 = args_.b1;
    oo.b2 = args_.b2;
    oo.eps = args_.epsilon;
    oo.weight_decay = args_.weight_decay;
    oo.momentum = args_.momentum;
    opt_ = optim::Optimizer(oo);
    sched_.kind = optim::schedule_from_name(args_.scheduler);
    sched_.lr = args_.learning_rate;
    sched_.lr_end = args_.learning_rate_end;
    sched_.warmup_steps = args_.warmup_steps;
    sched_.total_steps = total_steps_;
    state_.data_key = fold_in(Key::from_seed(args_.seed), 1);
    ckpt_ = CheckpointManager(args_.save_directory, args_.save_total_limit);
    fs::create_directories(args_.save_directory);
    metrics_ = std::make_unique<MetricsWriter>((fs::path(args_.save_directory) / "metrics.jsonl").string());
    progress_ = ProgressLine(args_.progress);
    peak_gflops_ = args_.peak_gflops;
  }

  TrainingArguments args_;
  std::optional<ByteLevelBPE> tok_;
  std::unique_ptr<Model> model_;
  TokenDataset train_;
  std::optional<TokenDataset> eval_;
  optim::Optimizer opt_;
  optim::Schedule sched_;
  TrainState state_;
  CheckpointManager ckpt_{"."};
  std::unique_ptr<MetricsWriter> metrics_;
  ProgressLine progress_{false};
  Truncation trunc_ = Truncation::keep_end;
  std::int64_t pad_id_ = 0;
  std::int64_t steps_per_epoch_ = 1, total_steps_ = 0;
  double peak_gflops_ = 0;
  std::optional<EvalMetrics> last_eval_;
  std::string last_checkpoint_, stop_reason_;
  std::int64_t last_saved_step_ = -1;
  bool resumed_ = false;
};

}  // namespace edl::train
