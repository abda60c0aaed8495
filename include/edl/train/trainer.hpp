// edl/train/trainer.hpp
// The causal-LM trainer (EasyDeL's Trainer), on one device or a simulated mesh:
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
// a checkpoint (checkpoint.hpp); every weight_distribution_log_steps: per-tensor weight statistics
// in <save_directory>/weights.jsonl (weight_stats.hpp); at the end: report.md and report.html
// (report.hpp) unless write_report is false. A non-finite loss or gradient norm stops with errc::invalid_argument
// before the parameters change (the last checkpoint stays the last good one); training_time_limit
// stops cleanly after the current step, with a checkpoint. The final hidden states are checked
// for NaN/Inf before the loss (a NaN never reaches the loss kernel). gradient_checkpointing
// picks the remat policy of the step at run time (remat::parse: its names as the layers' drop
// mask, one model type): nothing_saveable, dots_saveable, save_only_these_names(...), ...
// trade step time for activation memory (docs/training.md), on one device and on a mesh
// (ShardedLlama::set_remat).
//
// With a "lora" section (LoRA; with "quantize_base" too, QLoRA over a quantized base): the
// adapters are added after the model is built or loaded, every other parameter is frozen (no
// gradient, no optimizer state, its bits unchanged), each micro-batch draws its own dropout
// mask, checkpoints hold adapter_config.json + adapter_model.safetensors (PEFT) instead of the
// model, and the end of training writes <save_directory>/adapter/ (docs/lora.md).
//
// On a mesh (sharding_axis_dims with more than one device): the model is sharded by the Llama
// partition rules (models::ShardedLlama: dp and fsdp split the batch, fsdp the parameters, tp
// the heads and the MLP, sp the tokens), the optimizer state is sharded like the parameters
// (optim::ShardedOptimizer, ZeRO), clipping uses the mesh-wide gradient norm. Checkpoints hold
// the whole model and optimizer state, the same files as a one-device run, so a run resumes
// on another mesh shape; each process writes its devices' blocks into them (sharded_save.hpp)
// and reads only those back on resume (sharded_load.hpp), so no process gathers the model to
// save or resume. model() and optimizer() gather on demand.
//
// On several processes (mpirun): start the launch first (edl::start_launch, mesh/launch.hpp);
// the default mesh is then spread over the ranks (or pass a MeshFactory of your own). Every
// process constructs the trainer with the same arguments and calls the same methods. The
// devices are spread over the processes, every process gets the same losses (the collectives
// are exact), and only rank 0
// (processes().is_primary()) prints progress and writes metrics.jsonl, weights.jsonl and the
// report. A checkpoint is written by all of them, each its part, and committed by rank 0
// (checkpoint.hpp); it loads on any number of processes and any mesh shape (docs/distributed.md).
// training_time_limit follows rank 0's clock; callbacks that stop training must decide the
// same on every process (they see the same losses).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/process_memory.hpp>
#include <edl/core/rng.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/io/tfevents.hpp>
#include <edl/mesh/launch.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/lora/apply.hpp>
#include <edl/lora/peft.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/optim/clip.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/schedule.hpp>
#include <edl/optim/sharded_optimizer.hpp>
#include <edl/tokenizer/all.hpp>
#include <edl/train/checkpoint.hpp>
#include <edl/train/sharded_load.hpp>
#include <edl/train/sharded_save.hpp>
#include <edl/train/state.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/sft_data.hpp>
#include <edl/train/preference.hpp>
#include <edl/train/evaluation.hpp>
#include <edl/train/metrics.hpp>
#include <edl/train/report.hpp>
#include <edl/train/training_arguments.hpp>
#include <edl/train/weight_stats.hpp>

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

template <PolicyLike Pol>
class BasicTrainer;

/// Builds the trainer's mesh of {dp, fsdp, ep, tp, sp} devices (TrainingArguments::mesh_dims()).
/// Empty: create_mesh, every device a thread of this process. A program launched on several
/// processes attaches the mesh to them before returning it, e.g. with MPI:
///   [&](auto dims) { auto m = create_mesh(dims); mpi::attach(m, session, m.size() / session.size()); return m; }
/// and should check first that the ranks can share the devices evenly (an edl::Error otherwise).
using MeshFactory = std::function<DefaultMesh(const MeshDims& dims)>;

/// User callbacks: any member may be empty. on_step_end returning false stops training.
/// EasyDeL's start_training_hook, start_evaluation_hook and finish are on_train_begin (after a
/// resume, before the first step), on_evaluate_begin and on_train_end (after the last checkpoint
/// and the adapter are written); on_log sees every metrics.jsonl line (training and evaluation)
/// before it is written and may change or add fields (what a hook that returns new metrics does).
template <PolicyLike Pol>
struct BasicTrainerCallback {
  std::function<void(BasicTrainer<Pol>&)> on_train_begin;
  std::function<void(BasicTrainer<Pol>&, std::int64_t step)> on_step_start;
  std::function<bool(BasicTrainer<Pol>&, const StepMetrics&)> on_step_end;
  std::function<void(BasicTrainer<Pol>&, std::int64_t step)> on_evaluate_begin;
  std::function<void(BasicTrainer<Pol>&, const EvalMetrics&)> on_evaluate;
  std::function<void(BasicTrainer<Pol>&, const std::string& checkpoint)> on_save;
  std::function<void(BasicTrainer<Pol>&, nlohmann::ordered_json& line)> on_log;
  std::function<void(BasicTrainer<Pol>&, const TrainResult&)> on_train_end;
};

/// The trainer of a LlamaForCausalLM<Pol>. Pol's param_t is the storage of the model's
/// parameters, and param_dtype must name it: float (Trainer), or bf16 / f16 (BF16Trainer,
/// F16Trainer: mixed precision, the optimizer keeps f32 master weights and rounds them to the
/// storage after every update; gradients and every accumulation stay f32). Pol's compute_t
/// is the activations' type, and dtype must name it: f32, or bf16 / f16 (BF16ComputeTrainer).
template <PolicyLike Pol>
class BasicTrainer {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using Callback = BasicTrainerCallback<Pol>;

  /// Builds model, tokenizer and datasets from `args` (see docs/training.md). The mesh comes
  /// first (from `make_mesh` when given), so a launch that cannot run fails before any work.
  explicit BasicTrainer(TrainingArguments args, MeshFactory make_mesh = {}) : args_(std::move(args)) {
    validate_arguments();
    build_mesh(make_mesh);
    build_tokenizer();
    build_model();
    DataOptions d{args_.max_sequence_length, eos_or(-1), model_->config().vocab_size, args_.packing};
    if (args_.trainer == "sft" || args_.preference()) {  // records, completions scored (sft_data.hpp)
      EDL_CHECK(tok_.has_value(), errc::invalid_argument, args_.where("trainer"), args_.trainer,
                " reads text records and needs a tokenizer");
      const SftOptions so{args_.completion_only_loss, eos_or(-1)};
      if (args_.preference()) {
        train_ = load_preference_dataset(args_.train_data, *tok_, so, d.vocab_size);
        if (!args_.eval_data.empty()) eval_ = load_preference_dataset(args_.eval_data, *tok_, so, d.vocab_size);
      } else {
        train_ = load_sft_dataset(args_.train_data, *tok_, so, d.vocab_size);
        if (!args_.eval_data.empty()) eval_ = load_sft_dataset(args_.eval_data, *tok_, so, d.vocab_size);
        if (args_.packing) {  // records packed into full rows, kept apart by document boundaries
          train_ = pack_documents(train_, args_.max_sequence_length);
          if (eval_) eval_ = pack_documents(*eval_, args_.max_sequence_length);
        }
      }
    } else {
      train_ = load_dataset(args_.train_data, tok_ ? &*tok_ : nullptr, d);
      if (!args_.eval_data.empty()) eval_ = load_dataset(args_.eval_data, tok_ ? &*tok_ : nullptr, d);
    }
    finish_setup();
  }

  /// Explicit parts (programs and tests); `model` is used as given (no init, no loading).
  BasicTrainer(TrainingArguments args, Model model, std::optional<tokenizer::Tokenizer> tokenizer,
          TokenDataset train_data, std::optional<TokenDataset> eval_data = std::nullopt, MeshFactory make_mesh = {})
      : args_(std::move(args)),
        tok_(std::move(tokenizer)),
        model_(std::make_unique<Model>(std::move(model))),
        train_(std::move(train_data)),
        eval_(std::move(eval_data)) {
    if (args_.train_data.empty()) args_.train_data = {"<in memory>"};
    validate_arguments();
    build_mesh(make_mesh);
    finish_setup();
  }

  /// From a training state (the seeds' Trainer(model_state=...)): its model, its optimizer
  /// (kind, hyper-parameters, slots and step count: the arguments' optimizer fields are
  /// replaced by the state's) and its step, from which training continues: the schedule's
  /// rate and the data position are those of that step, as if the run had got there itself.
  BasicTrainer(TrainingArguments args, TrainingState<Pol> state, std::optional<tokenizer::Tokenizer> tokenizer,
               TokenDataset train_data, std::optional<TokenDataset> eval_data = std::nullopt, MeshFactory make_mesh = {})
      : BasicTrainer(with_optimizer_of(std::move(args), state.optimizer.options()), std::move(state.model),
                     std::move(tokenizer), std::move(train_data), std::move(eval_data), std::move(make_mesh)) {
    opt_ = std::move(state.optimizer);
    state_.step = state.step;
    state_.epoch = state.step / steps_per_epoch_;
    state_.batch_in_epoch = state.step % steps_per_epoch_;
    state_.optimizer_step_count = opt_.step_count();
    if (mesh_) shard_host();  // again, with the state's optimizer slots
  }

  /// The run as a training state (model, optimizer, step; gathered from the mesh first): what
  /// TrainingState's own loop, save_state or another Trainer continue from.
  TrainingState<Pol> model_state() {
    sync_host();
    return TrainingState<Pol>{state_.step, *model_, opt_};
  }

  /// Waits for a checkpoint still being written (async_checkpointing); its errors are lost here.
  virtual ~BasicTrainer() {
    if (pending_save_ && pending_save_->thread.joinable()) pending_save_->thread.join();
  }
  BasicTrainer(const BasicTrainer&) = delete;
  BasicTrainer& operator=(const BasicTrainer&) = delete;

  std::vector<Callback> callbacks;
  CheckpointHooks checkpoint_hooks;  // tests: fail a save midway
  /// The seeds' data_collator: builds every training and evaluation batch from its dataset
  /// rows in place of collate_rows (empty: collate_rows, with the arguments' truncation,
  /// padding_free and the tokenizer's pad id). What it returns is checked (check_batch).
  DataCollator data_collator;

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

  /// The model (and optimizer) as one device holds them; on a mesh, gathered first (every
  /// process calls it: gathering is collective).
  Model& model() {
    sync_host();
    return *model_;
  }
  optim::Optimizer& optimizer() {
    sync_host();
    return opt_;
  }
  /// Whether this process holds the whole model on the host. On a mesh a run built from its
  /// arguments (any but QLoRA) draws or reads the model straight into the devices' blocks and
  /// holds no host copy until model(), optimizer() or training_state() gathers one.
  bool host_holds_model() const noexcept { return host_filled_; }
  /// Parameters of the model (without gathering it).
  std::int64_t param_count() const { return host_filled_ ? model_->param_count() : param_count_; }
  /// Devices of the mesh the trainer runs on (1: no mesh).
  std::int64_t mesh_devices() const noexcept { return mesh_ ? mesh_->size() : 1; }
  /// The processes the mesh spans (one unless the MeshFactory attached it to several).
  const ProcessGroup& processes() const noexcept { return processes_; }
  /// The sharded model and optimizer (null without a mesh).
  models::ShardedLlama<Pol>* sharded_model() noexcept { return sharded_.get(); }
  optim::ShardedOptimizer<models::ShardedLlama<Pol>>* sharded_optimizer() noexcept { return sopt_.get(); }
  const TrainState& state() const noexcept { return state_; }
  const TrainingArguments& args() const noexcept { return args_; }
  const std::optional<tokenizer::Tokenizer>& tokenizer() const noexcept { return tok_; }
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
    for (auto& c : callbacks)
      if (c.on_evaluate_begin) c.on_evaluate_begin(*this, state_.step);
    // evaluate_dataset, what `edl eval` runs: a checkpoint's held-out loss reads the same in both.
    // On a mesh the sharded model scores the batches (nothing is gathered).
    ojson j = ojson::object();
    if (pairs()) {  // preference pairs: the loss and TRL's metrics with eval_ names
      const PreferenceMetrics pm = evaluate_pairs();
      e.loss = pm.loss;
      e.perplexity = std::exp(pm.loss);
      e.accuracy = pm.rewards_accuracies;
      e.tokens = pm.pairs;
      j["step"] = state_.step;
      j["eval_loss"] = pm.loss;
      j["eval_rewards/chosen"] = pm.rewards_chosen;
      j["eval_rewards/rejected"] = pm.rewards_rejected;
      j["eval_rewards/accuracies"] = pm.rewards_accuracies;
      j["eval_rewards/margins"] = pm.rewards_margins;
      j["eval_logps/chosen"] = pm.logps_chosen;
      j["eval_logps/rejected"] = pm.logps_rejected;
      j["eval_pairs"] = pm.pairs;
    } else {
      const std::string where = "evaluation at step " + std::to_string(state_.step);
      if (sharded_)
        e = evaluate_dataset_on_mesh(*sharded_, *eval_, eval_options(), sharded_->batch_multiple(),
                                     sharded_->seq_multiple(), where);
      else
        e = evaluate_dataset(*model_, *eval_, eval_options(), where);
      j["step"] = state_.step;
      j["eval_loss"] = e.loss;
      j["eval_perplexity"] = e.perplexity;
      j["eval_accuracy"] = e.accuracy;
      j["eval_tokens"] = e.tokens;
    }
    e.step = state_.step;
    last_eval_ = e;
    write_metrics(j);
    char buf[160];
    std::snprintf(buf, sizeof buf, "eval at step %lld: loss %.4f, perplexity %.2f, accuracy %.3f",
                  static_cast<long long>(e.step), e.loss, e.perplexity, e.accuracy);
    progress_.message(buf);
    for (auto& c : callbacks)
      if (c.on_evaluate) c.on_evaluate(*this, e);
    return e;
  }

  /// Writes checkpoint-<step>; returns its path. On a mesh (without LoRA) every process writes
  /// its devices' blocks of the model and optimizer state (save_sharded_state): no process
  /// gathers the model. With async_checkpointing the model (or its blocks), optimizer and state
  /// are copied and a background thread writes the copy while training goes on: still
  /// atomically (checkpoint.hpp), one save at a time (a new one first waits for the last),
  /// on_save and "saved" once the folder is complete, and a failed write rethrown by the next
  /// call that waits (the next save, a step's end, the end of train()). Under mpirun the
  /// background save of a mesh's blocks agrees over channels of its own
  /// (ProcessGroup::separate), and every process waits for it at the same points (the next
  /// save, the end); a LoRA run's save (its adapters gathered) stays in step there.
  std::string save_checkpoint() {
    TrainState s = state_;
    s.eval_loss = (last_eval_ && last_eval_->step == state_.step) ? std::optional<double>(last_eval_->loss) : std::nullopt;
    s.training_arguments = args_.to_json();
    last_saved_step_ = state_.step;
    // In the background on one process, and for a mesh's blocks on several.
    const bool background = args_.async_checkpointing && (processes_.size() == 1 || (sharded_ && !adapters_));
    if (background) wait_for_checkpoint();  // one save at a time
    if (sharded_ && !adapters_) {  // block by block from the mesh: nothing is gathered
      if (background)  // a copy of the blocks belongs to the thread; the mesh's move on meanwhile
        return save_in_background([model = sharded_->snapshot(), opt = *sopt_, s = std::move(s), tok = tok_,
                                   ckpt = ckpt_, hooks = checkpoint_hooks, pg = processes_.separate()]() mutable {
          save_sharded_checkpoint(ckpt, model, opt, s, tok ? &*tok : nullptr, hooks, pg);
        });
      const std::string p = save_sharded_checkpoint(ckpt_, *sharded_, *sopt_, s, tok_ ? &*tok_ : nullptr,
                                                    checkpoint_hooks, processes_);
      saved(p);
      return p;
    }
    // A LoRA run's checkpoint holds the adapters and their optimizer slots: on a mesh those
    // alone are gathered (every process: gathering is collective), never the base.
    std::optional<Model> adapters;
    std::optional<optim::Optimizer> adapter_opt;
    if (sharded_) {
      adapters.emplace(sharded_->gather_adapters());
      adapter_opt.emplace(sopt_->gather(*sharded_));
    }
    if (!background) {
      const std::string p = ckpt_.save(adapters ? *adapters : *model_, adapter_opt ? *adapter_opt : opt_, s,
                                       tok_ ? &*tok_ : nullptr, checkpoint_hooks, processes_);
      saved(p);
      return p;
    }
    // The copies belong to the thread (the gathered adapters move there); the trainer's model
    // and optimizer move on meanwhile.
    return save_in_background([model = adapters ? std::move(*adapters) : Model(*model_),
                               opt = adapter_opt ? std::move(*adapter_opt) : opt_, s = std::move(s), tok = tok_,
                               ckpt = ckpt_, hooks = checkpoint_hooks]() mutable {
      ckpt.save(model, opt, s, tok ? &*tok : nullptr, hooks);
    });
  }

  /// Runs `write` (which owns copies of all it saves) on a background thread as the pending
  /// save of this step's checkpoint; returns its folder.
  template <class Write>
  std::string save_in_background(Write write) {
    auto job = std::make_unique<PendingSave>();
    job->path = ckpt_.path_for(state_.step);
    job->thread = std::thread([job = job.get(), write = std::move(write)]() mutable {
      try {
        write();
      } catch (...) {
        job->error = std::current_exception();
      }
      job->done.store(true, std::memory_order_release);
    });
    pending_save_ = std::move(job);
    return pending_save_->path;
  }

  /// Waits until a checkpoint being written in the background is complete (no-op without one);
  /// rethrows its error.
  void wait_for_checkpoint() {
    if (!pending_save_) return;
    pending_save_->thread.join();
    const std::unique_ptr<PendingSave> job = std::move(pending_save_);
    if (job->error) std::rethrow_exception(job->error);
    saved(job->path);
  }

  /// The preference loss of a batch of pairs wherever the policy runs (one device or the mesh),
  /// against DPO's reference (on the mesh, on the host, or the policy's base with its adapters
  /// off); with `backward`, ACCUMULATES the policy's gradients.
  PreferenceMetrics pair_loss(const Batch& b, bool backward, std::int64_t step_pairs = 0, std::int64_t step_chosen = 0) {
    const PreferenceOptions po = args_.preference_options();
    if (sharded_ && sharded_reference_)
      return sharded_preference_loss(*sharded_, sharded_reference_.get(), b, po, backward, step_pairs, step_chosen);
    if (sharded_) return sharded_preference_loss(*sharded_, reference_.get(), b, po, backward, step_pairs, step_chosen);
    if (reference_) return preference_loss(*model_, *reference_, b, po, backward, step_pairs, step_chosen);
    return preference_loss(*model_, b, po, backward, step_pairs, step_chosen);
  }

  /// The preference loss and metrics over eval_data's pairs (eval_batch() pairs a batch,
  /// max_evaluation_steps batches at most), means over the pairs; no gradient. On a mesh the
  /// sharded policy scores them (nothing is gathered).
  PreferenceMetrics evaluate_pairs() {
    PreferenceMetrics sum;
    for_each_eval_batch(*eval_, eval_options(), [&](const Batch& b) {
      const PreferenceMetrics m = pair_loss(b, /*backward=*/false);
      const double k = static_cast<double>(m.pairs);  // the batch's means, weighted by its pairs
      sum.loss += k * m.loss;
      sum.add_means(m, k);
      sum.pairs += m.pairs;
    }, /*rows_per_example=*/2);
    const double total = static_cast<double>(std::max<std::int64_t>(1, sum.pairs));
    sum.loss /= total;
    sum.scale_means(1.0 / total);
    return sum;
  }

  /// How evaluate() batches eval_data (eval_batch_size sequences, or the micro-batch;
  /// max_evaluation_steps batches).
  EvalOptions eval_options() const {
    EvalOptions o;
    o.max_sequence_length = args_.max_sequence_length;
    o.batch_size = args_.eval_batch();
    o.max_batches = args_.max_evaluation_steps;
    o.pad_id = pad_id_;
    o.truncation = trunc_;
    o.collator = data_collator;
    o.vocab_size = model_->config().vocab_size;
    return o;
  }

  /// Restores model, optimizer and position from a checkpoint folder; train() then continues
  /// from there instead of looking for the newest checkpoint in save_directory. Throws
  /// errc::io naming `dir` when it is not a complete checkpoint folder (no state.json).
  void resume_from(const std::string& dir) {
    EDL_CHECK(fs::is_directory(dir), errc::io, dir, "cannot resume: no such checkpoint folder");
    EDL_CHECK(fs::exists(fs::path(dir) / "state.json"), errc::io, dir,
              "cannot resume: not a complete checkpoint folder (state.json is missing; a checkpoint holds "
              "config.json, model.safetensors, optimizer.safetensors and state.json)");
    if (mesh_) {  // each process reads its devices' blocks; the host copy is gathered when asked for
      state_ = load_sharded_state(dir, *sharded_, *sopt_);
      host_stale_ = true;
    } else {
      state_ = load_state(dir, *model_, opt_);
    }
    last_checkpoint_ = dir;
    last_saved_step_ = state_.step;
    resumed_ = true;
  }

  /// Runs until total_steps(), the time limit or a stop request.
  TrainResult train() {
    TrainResult r;
    if (processes_.is_primary()) ckpt_.remove_temporaries();
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
    for (auto& c : callbacks)
      if (c.on_train_begin) c.on_train_begin(*this);
    auto session_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };

    std::vector<std::int64_t> order;
    std::int64_t order_epoch = -1;
    const std::int64_t B = args_.total_batch_size, A = args_.gradient_accumulation_steps, mb = args_.micro_batch_size();
    // The steps since the last metrics line, and (report_steps) since the last report.
    StepWindow log_win, report_win;
    std::int64_t session_tokens = 0;
    std::vector<std::int64_t> rows;

    while (state_.step < total_steps_ && stop_reason_.empty()) {
      on_step_start(state_.step);
      if (!stop_reason_.empty()) break;
      const auto t0 = std::chrono::steady_clock::now();
      if (order_epoch != state_.epoch) {
        order = epoch_order(examples(), state_.data_key, state_.epoch, args_.shuffle_train_dataset);
        order_epoch = state_.epoch;
      }
      // The step's micro-batches, then the step's number of target tokens.
      std::vector<Batch> micro;
      micro.reserve(static_cast<std::size_t>(A));
      std::int64_t targets = 0, input_tokens = 0, chosen = 0;
      for (std::int64_t a = 0; a < A; ++a) {
        rows.clear();
        for (std::int64_t i = 0; i < mb; ++i) {
          const std::int64_t ex = order[static_cast<std::size_t>(state_.batch_in_epoch * B + a * mb + i)];
          const std::int64_t per = pairs() ? 2 : 1;  // the pair's chosen and rejected sequences
          for (std::int64_t row = ex * per; row < (ex + 1) * per; ++row) rows.push_back(row);
        }
        // SFT and preferences score completions only; packed rows keep their documents apart.
        micro.push_back(collate_train(rows, state_.step, a));
        if (mesh_) pad_to_multiple(micro.back(), mesh_->axis_size("sp"), pad_id_);  // sp splits the sequence
        targets += micro.back().target_tokens();
        if (pairs()) chosen += preference_detail::chosen_targets(micro.back());
        for (auto m : micro.back().attention_mask) input_tokens += m;
      }
      if (sharded_) sharded_->zero_grad();
      else optim::zero_grad(*model_);
      nn::LossOptions lo;  // loss_config: z-loss, label smoothing, chunking (causal_lm and sft)
      lo.z_loss = static_cast<float>(args_.loss_config.z_loss);
      lo.label_smoothing = static_cast<float>(args_.loss_config.label_smoothing);
      lo.chunk_rows = args_.loss_config.chunk_token_size;
      lo.normalizer = static_cast<double>(std::max<std::int64_t>(targets, 1));
      double loss = 0, flops = 0, aux = 0;
      PreferenceMetrics pref;  // dpo, orpo: the step's sums over micro-batches
      for (std::size_t a = 0; a < micro.size(); ++a) {
        const Batch& b = micro[a];
        if (adapters_)  // each micro-batch its own dropout mask, the same on every run and mesh
          set_adapter_dropout(fold_in(fold_in(Key::from_seed(args_.seed), 2),
                                      static_cast<std::uint32_t>(state_.step * A + static_cast<std::int64_t>(a))));
        if (jitters())  // likewise the routers' input jitter (Mixtral's router_jitter_noise)
          set_router_jitter(fold_in(fold_in(Key::from_seed(args_.seed), 3),
                                    static_cast<std::uint32_t>(state_.step * A + static_cast<std::int64_t>(a))));
        if (pairs()) {
          const PreferenceMetrics pm = pair_loss(b, /*backward=*/true, B, chosen);
          loss += pm.loss;
          pref.nll_loss += pm.nll_loss;
          pref.add_means(pm, static_cast<double>(pm.pairs) / static_cast<double>(B));  // the step's means
        } else if (sharded_) {
          const nn::TokenLayout lay = b.layout();
          const nn::LossMetrics lm = sharded_->loss_and_grads(b.input_ids.data(), b.labels.data(), b.batch, b.seq, lo,
                                                              lay.attention_mask, lay.position_ids, lay.segment_ids);
          loss += lm.loss;
          aux += lm.aux_loss * static_cast<double>(lm.tokens) / lo.normalizer;
        } else {
          const nn::LossMetrics lm =
              guarded_causal_lm_loss(*model_, b, lo, /*backward=*/true, args_.gradient_checkpointing);
          loss += lm.loss;
          aux += lm.aux_loss * static_cast<double>(lm.tokens) / lo.normalizer;  // the step's token-weighted mean
        }
        flops += 3.0 * model_->flops_forward(b.batch, b.seq);
        if (!std::isfinite(loss)) break;
      }
      if (adapters_) set_adapter_dropout(std::nullopt);  // evaluation and inference: no dropout
      if (jitters()) set_router_jitter(std::nullopt);
      const std::string where = "train step " + std::to_string(state_.step + 1);
      const std::string keep = last_checkpoint_.empty() ? std::string("no checkpoint was written yet")
                                                        : "the last good checkpoint is " + last_checkpoint_;
      EDL_CHECK(std::isfinite(loss), errc::invalid_argument, where, "the loss is ", loss,
                "; training stopped before updating the parameters (", keep, ")");
      const double gnorm = sharded_ ? sopt_->clip_by_global_norm(*sharded_, args_.clip_grad)
                                    : optim::clip_by_global_norm(*model_, args_.clip_grad);
      EDL_CHECK(std::isfinite(gnorm), errc::invalid_argument, where, "the gradient norm is ", gnorm, " (loss ", loss,
                "); training stopped before updating the parameters (", keep, ")");
      const double lr = sched_.lr_at(state_.step);
      if (sharded_) {
        sopt_->step(*sharded_, lr);
        host_stale_ = true;
      } else {
        opt_.step(*model_, lr);
      }

      StepMetrics sm;
      sm.epoch = state_.epoch;
      ++state_.step;
      if (++state_.batch_in_epoch >= steps_per_epoch_) {
        state_.batch_in_epoch = 0;
        ++state_.epoch;
      }
      state_.tokens_seen += targets;
      state_.optimizer_step_count = sopt_ ? sopt_->step_count() : opt_.step_count();
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
      for (StepWindow* w : {&log_win, &report_win}) w->add(loss, aux, sm.step_seconds, flops, input_tokens);

      on_step_end(sm);
      const bool last = state_.step >= total_steps_;
      const bool log_now =
          state_.step % args_.log_steps == 0 || state_.step == first_step + 1 || last || !stop_reason_.empty();
      const bool report_now = args_.report_steps && tensorboard_ &&
                              (state_.step % *args_.report_steps == 0 || last || !stop_reason_.empty());
      // The step's line over a window of steps: means of the loss, throughput and MFU over it;
      // the rest (rate, norm, preference metrics) of the step itself.
      const auto step_line = [&](const StepWindow& w) {
        ojson j = ojson::object();
        j["step"] = state_.step;
        j["epoch"] = sm.epoch;
        j["loss"] = w.mean_loss();
        j["learning_rate"] = lr;
        j["grad_norm"] = gnorm;
        if (model_->config().is_moe() && model_->config().output_router_logits)
          j["aux_loss"] = w.aux / static_cast<double>(w.steps);  // unscaled; "loss" includes coef x it
        if (pairs()) {  // TRL's names, of the logged step
          j["rewards/chosen"] = pref.rewards_chosen;
          j["rewards/rejected"] = pref.rewards_rejected;
          j["rewards/accuracies"] = pref.rewards_accuracies;
          j["rewards/margins"] = pref.rewards_margins;
          j["logps/chosen"] = pref.logps_chosen;
          j["logps/rejected"] = pref.logps_rejected;
          if (args_.trainer == "orpo") {
            j["nll_loss"] = pref.nll_loss;
            j["log_odds_ratio"] = pref.log_odds_ratio;
            j["log_odds_chosen"] = pref.log_odds_chosen;
          }
        }
        j["tokens_per_s"] = w.tokens_per_s();
        j["mfu"] = w.mfu(peak_gflops_);
        if (args_.track_memory) {  // EasyDeL's track_memory: the process's resident set, now and its peak
          j["memory/resident_bytes"] = resident_bytes();
          j["memory/peak_resident_bytes"] = peak_resident_bytes();
        }
        j["elapsed_s"] = state_.elapsed_s;
        j["tokens_seen"] = state_.tokens_seen;
        return j;
      };
      if (log_now) {
        ojson j = step_line(log_win);
        write_metrics(j, /*report=*/!args_.report_steps);
      }
      if (report_now) {  // TensorBoard's own cadence: the line over the steps since the last report
        report(step_line(report_win));
        report_win = {};
      }
      // On a terminal the bar is redrawn after every step (from the log window so far);
      // metrics.jsonl and plain-line progress only get the logged steps.
      if (log_now || progress_.in_place()) {
        const double per_step = session_s() / static_cast<double>(state_.step - first_step);
        progress_.update(state_.step, total_steps_, log_win.mean_loss(), lr, log_win.tokens_per_s(),
                         log_win.mfu(peak_gflops_), per_step * static_cast<double>(total_steps_ - state_.step));
      }
      if (log_now) log_win = {};
      if (args_.evaluation_steps && eval_ && state_.step % *args_.evaluation_steps == 0) evaluate();
      if (args_.weight_distribution_log_steps > 0 && state_.step % args_.weight_distribution_log_steps == 0)
        log_weight_stats();
      // One process takes a finished save at once; several wait at the same points (the next
      // save, the end), so that a failed save stops every process at the same step.
      if (processes_.size() == 1 && pending_save_ && pending_save_->done.load(std::memory_order_acquire))
        wait_for_checkpoint();
      if (args_.save_steps && state_.step % *args_.save_steps == 0) save_checkpoint();
      if (args_.training_time_limit) {
        bool over = state_.elapsed_s >= *args_.training_time_limit;
        // Clocks differ between processes: rank 0's decides, so all stop after the same step.
        if (processes_.size() > 1) over = processes_.from_primary(over ? 1 : 0) != 0;
        if (over) request_stop("time_limit");
      }
    }
    if (state_.step == first_step && stop_reason_.empty()) {
      r.stop_reason = "nothing_to_do";
    } else {
      r.stop_reason = stop_reason_.empty() ? "max_steps" : stop_reason_;
      if (eval_ && (!last_eval_ || last_eval_->step != state_.step)) evaluate();
      if (last_saved_step_ != state_.step) save_checkpoint();
    }
    wait_for_checkpoint();
    if (adapters_ && r.stop_reason != "nothing_to_do") {
      // The adapters alone, gathered on a mesh (every process: gathering is collective).
      std::optional<Model> gathered;
      if (sharded_) gathered.emplace(sharded_->gather_adapters());
      if (processes_.is_primary()) {
        const fs::path dir = fs::path(args_.save_directory) / "adapter";
        lora::save_adapter(dir, gathered ? *gathered : *model_, base_model_name(args_.to_json()));
        progress_.message("adapter: " + dir.string());
      }
    }
    progress_.finish();
    r.steps = state_.step;
    r.seconds = session_s();
    r.tokens_per_s = r.seconds > 0 ? static_cast<double>(session_tokens) / r.seconds : 0.0;
    if (last_eval_) r.eval_loss = last_eval_->loss;
    r.checkpoint = last_checkpoint_;
    if (state_.step == first_step && state_.last_loss) r.final_loss = r.first_loss = *state_.last_loss;
    if (args_.write_report && r.stop_reason != "nothing_to_do" && processes_.is_primary()) write_run_report();
    for (auto& c : callbacks)
      if (c.on_train_end) c.on_train_end(*this, r);
    return r;
  }

 private:
  /// Sums over a window of optimizer steps (since the last metrics line or report).
  struct StepWindow {
    double loss = 0, aux = 0, seconds = 0, flops = 0;
    std::int64_t steps = 0, tokens = 0;
    void add(double step_loss, double step_aux, double step_seconds, double step_flops, std::int64_t step_tokens) {
      loss += step_loss;
      aux += step_aux;
      seconds += step_seconds;
      flops += step_flops;
      tokens += step_tokens;
      ++steps;
    }
    double mean_loss() const { return steps ? loss / static_cast<double>(steps) : 0.0; }
    double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0; }
    /// Model FLOPs utilisation over the window against `peak_gflops` (0 when unknown).
    double mfu(double peak_gflops) const {
      return seconds > 0 && peak_gflops > 0 ? flops / seconds / (peak_gflops * 1e9) : 0.0;
    }
  };
  /// A checkpoint a background thread writes (async_checkpointing).
  struct PendingSave {
    std::thread thread;
    std::string path;
    std::exception_ptr error;
    std::atomic<bool> done{false};
  };

  /// A checkpoint folder is complete: it is the last one, and the callbacks hear of it.
  void saved(const std::string& p) {
    last_checkpoint_ = p;
    progress_.message("saved " + p);
    for (auto& c : callbacks)
      if (c.on_save) c.on_save(*this, p);
  }

  /// Micro-batch `a` of the step after `step`: the user's collator (checked) or collate_rows.
  Batch collate_train(std::span<const std::int64_t> rows, std::int64_t step, std::int64_t a) const {
    if (!data_collator) return collate_rows(train_, rows, args_.max_sequence_length, pad_id_, trunc_, args_.padding_free);
    Batch b = data_collator(train_, rows);
    check_batch(b, model_->config().vocab_size,
                "data_collator (train step " + std::to_string(step + 1) + ", micro-batch " + std::to_string(a) + ")");
    return b;
  }

  /// `args` with the optimizer fields of `o` (a training state's optimizer is the run's).
  static TrainingArguments with_optimizer_of(TrainingArguments args, const optim::OptimizerOptions& o) {
    args.set_optimizer(o);
    return args;
  }

  /// One metrics.jsonl line, after the on_log callbacks; reported to TensorBoard too unless
  /// `report` is false (report_steps: training lines have their own cadence there).
  void write_metrics(ojson& line, bool report = true) {
    for (auto& c : callbacks)
      if (c.on_log) c.on_log(*this, line);
    metrics_->write(line);
    if (report) this->report(line);
  }
  /// Every number of `line` but its step as a TensorBoard scalar under the line's own key
  /// (use_tensorboard; nothing without it).
  void report(const ojson& line) {
    if (!tensorboard_) return;
    const std::int64_t step = line.value("step", state_.step);
    for (const auto& [key, v] : line.items())
      if (v.is_number() && key != "step") tensorboard_->scalar(key, v.template get<float>(), step);
  }
  /// Shards the host model and optimizer state over the mesh (setup and resume), or, where
  /// the host holds no values, draws or reads the model straight into its blocks.
  void shard_host() {
    const bool straight = !sharded_ && !host_filled_;  // no process holds the whole model
    // A model read from a folder, or drawn from the run's seed, straight into its blocks.
    const auto build = [&](const std::optional<std::string>& folder) {
      return folder ? std::make_unique<models::ShardedLlama<Pol>>(models::from_pretrained_sharded<Pol>(*folder, *mesh_))
                    : std::make_unique<models::ShardedLlama<Pol>>(model_->config(),
                                                                  fold_in(Key::from_seed(args_.seed), 0), *mesh_);
    };
    if (straight) {
      sharded_ = build(weights_dir_);
      if (args_.trainer == "dpo" && !args_.reference_model.empty()) sharded_reference_ = build(args_.reference_model);
      else if (args_.trainer == "dpo" && !adapters_) sharded_reference_ = build(weights_dir_);  // the policy as it starts
    } else {
      sharded_ = std::make_unique<models::ShardedLlama<Pol>>(*model_, *mesh_);
    }
    if (straight && adapters_) sharded_->add_adapters(lora_config(), args_.where("lora"));
    sharded_->set_remat(remat::parse(args_.gradient_checkpointing));
    sopt_ = std::make_unique<optim::ShardedOptimizer<models::ShardedLlama<Pol>>>(opt_.options(), *sharded_);
    if (straight) {
      // The host model keeps its structure (config, flop counts) and none of its storage; it
      // is gathered only when asked for (model(), optimizer(), training_state()).
      param_count_ = model_->param_count();
      model_->visit_params("", [](std::string_view, auto& p) {
        models::sharded_detail::free_tensor(p.value);
        models::sharded_detail::free_tensor(p.grad);
      });
    } else {
      sopt_->load(opt_, *sharded_);
    }
    host_stale_ = straight;
  }
  /// The adapters' dropout key for the next forward and backward, wherever the model runs.
  void set_adapter_dropout(std::optional<Key> key) {
    if (sharded_) sharded_->set_adapter_dropout(key);
    else lora::set_dropout(*model_, key);
  }
  bool jitters() const { return model_->config().is_moe() && model_->config().router_jitter_noise > 0; }
  void set_router_jitter(std::optional<Key> key) {
    if (sharded_) sharded_->set_router_jitter(key);
    else model_->set_router_jitter(key);
  }
  /// Gathers the sharded model and optimizer state into the host copies when they moved on.
  void sync_host() {
    if (!sharded_ || !host_stale_) return;
    *model_ = sharded_->gather_model();
    opt_ = sopt_->gather(*sharded_);
    host_stale_ = false;
    host_filled_ = true;
  }

  /// Appends the weights.jsonl record of the current step (weight_stats.hpp); the gradients
  /// are still those of the step (after clipping).
  void log_weight_stats() {
    if (!weights_ && processes_.is_primary())
      weights_ = std::make_unique<MetricsWriter>((fs::path(args_.save_directory) / "weights.jsonl").string());
    std::vector<TensorStats> stats;
    if (sharded_) {  // one tensor gathered at a time: never the whole model
      for (const std::string& name : sharded_->names()) {
        const auto w = sharded_->gather_param(name);
        stats.push_back(tensor_stats(w.data(), static_cast<std::int64_t>(w.size())));
        stats.back().name = name;
      }
    } else {
      stats = weight_stats(*model_);
    }
    if (sharded_)  // the step's gradients live on the mesh: their norms come from the gathered blocks
      for (auto& t : stats) {
        if (!sharded_->trainable(t.name)) continue;  // a LoRA base has no gradient
        const xt::xarray<float> g = gather(sharded_->grad(t.name));
        double sq = 0;
        for (float v : g) sq += static_cast<double>(v) * v;
        t.grad_norm = std::sqrt(sq);
      }
    if (weights_) weights_->write(weight_stats_json(state_.step, stats));
  }

  /// Writes report.md / report.html in save_directory from metrics.jsonl (report.hpp).
  void write_run_report() {
    RunReport rep = report_from_metrics(metrics_->path());
    rep.summary.model_name = args_.model_name;
    rep.summary.parameters = param_count();
    write_report(args_.save_directory, rep);
    progress_.message("report: " + (fs::path(args_.save_directory) / "report.html").string());
  }

 private:
  std::int64_t eos_or(std::int64_t fallback) const {
    if (tok_ && tok_->eos_id()) return *tok_->eos_id();
    return fallback;
  }

  void build_tokenizer() {
    const ojson& t = args_.tokenizer;
    const std::string w = args_.where("tokenizer");
    if (t.is_null() || (t.is_string() && t.get<std::string>() == "none")) return;
    if (t.is_string() && t.get<std::string>() == "byte") {
      tok_ = tokenizer::byte_level_tokenizer();
    } else if (t.is_string()) {
      tok_ = tokenizer::Tokenizer::from_file(t.get<std::string>());
    } else {  // {"train_bpe": vocab_size}: trained on the text of train_data, saved next to the checkpoints
      const std::string saved = (fs::path(args_.save_directory) / "tokenizer.json").string();
      if (args_.resume_if_possible && fs::exists(saved)) {
        tok_ = tokenizer::Tokenizer::from_file(saved);
        return;
      }
      std::vector<std::string> docs;
      for (const auto& f : args_.train_data) {
        if (detail::ends_with(f, ".npy") || detail::ends_with(f, ".bin")) continue;
        auto d = detail::ends_with(f, ".jsonl") ? read_jsonl_documents(f) : read_text_documents(f);
        docs.insert(docs.end(), d.begin(), d.end());
      }
      EDL_CHECK(!docs.empty(), errc::config, w, "train_bpe needs text train_data (.jsonl or text files)");
      tok_ = tokenizer::train_byte_level_bpe(docs, t["train_bpe"].get<std::int64_t>());  // the same on every process
      fs::create_directories(args_.save_directory);
      if (processes_.is_primary()) tok_->save(saved);
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
    if (mesh_ && shards_directly()) {  // shard_host() draws or reads the model straight into its blocks
      weights_dir_ = weights_dir;
      host_filled_ = false;
      return;
    }
    if (weights_dir) load_model_weights(*weights_dir, *model_);
    else model_->init(fold_in(Key::from_seed(args_.seed), 0));
  }

  /// Whether a run on a mesh builds its model straight into the devices' blocks and keeps no
  /// host copy: every run but QLoRA (whose quantized base runs on one device). DPO's reference
  /// is built there too, and preference pairs are evaluated on the mesh.
  bool shards_directly() const { return args_.quantize_base.empty(); }

  /// Preference optimisation (dpo, orpo): the data holds (chosen, rejected) pairs of sequences.
  bool pairs() const noexcept { return args_.preference(); }
  /// Training examples: sequences, or preference pairs.
  std::int64_t examples() const noexcept { return pairs() ? train_.size() / 2 : train_.size(); }

  /// The arguments' own checks, and param_dtype against this trainer's parameter type (a
  /// Trainer told "bfloat16" would otherwise train in f32 without a word).
  void validate_arguments() const {
    args_.validate();
    constexpr DType mine = dtype_of<typename Pol::param_t>::value;
    EDL_CHECK(args_.param_storage() == mine, errc::invalid_argument, args_.where("param_dtype"), "\"", args_.param_dtype,
              "\" names ", dtype_name(args_.param_storage()), " parameters, but this trainer stores ", dtype_name(mine),
              " (Trainer: float32, BF16Trainer: bfloat16, F16Trainer: float16)");
    constexpr DType computes = dtype_of<typename Pol::compute_t>::value;
    EDL_CHECK(args_.compute_storage() == computes, errc::invalid_argument, args_.where("dtype"), "\"", args_.dtype,
              "\" names ", dtype_name(args_.compute_storage()), " activations, but this trainer computes in ",
              dtype_name(computes), " (BasicTrainer<Policy<Param, Compute>>: Compute is the dtype)");
  }

  void finish_setup() {
    EDL_CHECK(examples() >= args_.total_batch_size, errc::config, args_.where("total_batch_size"),
              "the training data has ", examples(), pairs() ? " preference pairs" : " sequences", " of at most ",
              args_.max_sequence_length, " tokens, fewer than one batch of ", args_.total_batch_size);
    steps_per_epoch_ = examples() / args_.total_batch_size;  // the last partial batch is dropped
    // DPO's frozen reference: a folder; the policy's base when it trains adapters (switched
    // off for the reference's forward: no second copy); else the policy as it starts. A model
    // built straight into a mesh's blocks gets its reference there too (shard_host).
    if (args_.trainer == "dpo" && host_filled_) {
      if (args_.reference_model.empty()) {
        if (!args_.lora && !lora::lora_is_enabled(*model_)) reference_ = std::make_unique<Model>(*model_);
      } else {
        const auto rc = models::LlamaConfig::from_file((fs::path(args_.reference_model) / "config.json").string());
        reference_ = std::make_unique<Model>(rc);
        load_model_weights(args_.reference_model, *reference_);
      }
    }
    total_steps_ = args_.max_training_steps ? *args_.max_training_steps : args_.num_train_epochs * steps_per_epoch_;
    trunc_ = truncation_from_name(args_.truncation_mode);
    pad_id_ = tok_ && tok_->pad_id() ? *tok_->pad_id() : (tok_ && tok_->eos_id() ? *tok_->eos_id() : 0);
    opt_ = optim::Optimizer(args_.optimizer_options());
    sched_ = args_.schedule(total_steps_);
    state_.data_key = fold_in(Key::from_seed(args_.seed), 1);
    ckpt_ = CheckpointManager(args_.save_directory, args_.save_total_limit);
    fs::create_directories(args_.save_directory);
    // One process writes the run's files and prints; the others' writer and line are silent.
    metrics_ = processes_.is_primary()
                   ? std::make_unique<MetricsWriter>((fs::path(args_.save_directory) / "metrics.jsonl").string())
                   : std::make_unique<MetricsWriter>();
    if (args_.use_tensorboard && processes_.is_primary())
      tensorboard_ = std::make_unique<io::EventFileWriter>(fs::path(args_.save_directory) / "tensorboard");
    progress_ = ProgressLine(args_.progress && processes_.is_primary()
                                 ? progress_style_from_name(args_.progress_bar_type, args_.where("progress_bar_type"))
                                 : ProgressStyle::none);
    peak_gflops_ = args_.peak_gflops;
    add_adapters();
    if (mesh_) shard_host();
  }

  /// QLoRA's quantized base, then the LoRA adapters, when the arguments ask for them (a model
  /// given already adapted is used as it is).
  void add_adapters() {
    if (!args_.quantize_base.empty() && !nn::is_quantized(*model_)) {
      nn::QuantizationConfig q;
      q.method = quant::parse_format(args_.quantize_base, args_.where("quantize_base"));
      nn::quantize(*model_, q);
    }
    if (args_.lora && !lora::lora_is_enabled(*model_)) lora::apply_lora(*model_, lora_config(), args_.where("lora"));
    adapters_ = lora::lora_is_enabled(*model_);
  }
  /// The arguments' LoRA section, drawing its adapters from the run's seed.
  lora::LoraConfig lora_config() const {
    lora::LoraConfig c = *args_.lora;
    c.seed = args_.seed;
    return c;
  }

  /// The mesh of sharding_axis_dims (from `make_mesh` when given, else spread over the ranks
  /// of this process's launch: edl::launch_mesh); none for one device on one process.
  void build_mesh(const MeshFactory& make_mesh) {
    if (args_.mesh_devices() == 1 && !make_mesh && launch().ranks == 1) return;
    DefaultMesh m = make_mesh ? make_mesh(args_.mesh_dims()) : launch_mesh(args_.mesh_dims(), args_.where("sharding_axis_dims"));
    EDL_CHECK(m.size() == args_.mesh_devices(), errc::invalid_argument, args_.where("sharding_axis_dims"),
              "the mesh factory made a mesh of ", m.size(), " devices, expected ", args_.mesh_devices());
    processes_ = ProcessGroup(m);
    if (m.size() > 1) mesh_.emplace(std::move(m));
  }

  TrainingArguments args_;
  std::optional<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> reference_;  // dpo: frozen (none: the policy without its adapters)
  std::unique_ptr<models::ShardedLlama<Pol>> sharded_reference_;  // dpo on a mesh built straight into its blocks
  TokenDataset train_;
  std::optional<TokenDataset> eval_;
  optim::Optimizer opt_;
  optim::Schedule sched_;
  TrainState state_;
  CheckpointManager ckpt_{"."};
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<io::EventFileWriter> tensorboard_;  // use_tensorboard: a new event file per run
  std::unique_ptr<MetricsWriter> weights_;  // opened at the first weight-statistics step
  ProgressLine progress_{false};
  Truncation trunc_ = Truncation::keep_end;
  std::int64_t pad_id_ = 0;
  std::int64_t steps_per_epoch_ = 1, total_steps_ = 0;
  double peak_gflops_ = 0;
  std::optional<EvalMetrics> last_eval_;
  std::string last_checkpoint_, stop_reason_;
  std::int64_t last_saved_step_ = -1;
  bool resumed_ = false;
  std::optional<DefaultMesh> mesh_;
  ProcessGroup processes_;  // this process alone unless the mesh spans several
  std::unique_ptr<models::ShardedLlama<Pol>> sharded_;
  std::unique_ptr<optim::ShardedOptimizer<models::ShardedLlama<Pol>>> sopt_;
  bool host_stale_ = false;  // the sharded model has moved on since the host copy was gathered
  bool host_filled_ = true;  // the host model holds values (false: built straight into the mesh's blocks)
  std::optional<std::string> weights_dir_;  // the folder the mesh's blocks are read from (shards_directly)
  std::int64_t param_count_ = 0;             // the model's parameters when the host holds none
  bool adapters_ = false;    // LoRA: only the adapters train
  std::unique_ptr<PendingSave> pending_save_;  // async_checkpointing: the save being written
};

using Trainer = BasicTrainer<DefaultPolicy>;
using TrainerCallback = BasicTrainerCallback<DefaultPolicy>;
/// Mixed precision: bf16 parameters, f32 master weights in the optimizer (param_dtype "bfloat16").
using BF16Trainer = BasicTrainer<BF16ParamsPolicy>;
/// Mixed precision with IEEE f16 parameters (param_dtype "float16"): as BF16Trainer, with f16's
/// 10-bit mantissa and its range (|w| < 65504; no loss scaling is needed, gradients stay f32).
using F16Trainer = BasicTrainer<F16ParamsPolicy>;
/// bf16 activations (dtype "bfloat16"; f32 accumulation) on f32 parameters (param_dtype "float32").
using BF16ComputeTrainer = BasicTrainer<BF16ComputePolicy>;
/// bf16 activations on bf16 parameters (dtype and param_dtype "bfloat16"; f32 master weights).
using BF16Bf16Trainer = BasicTrainer<BF16Policy>;

}  // namespace edl::train
