// edl/models/llama/plan.hpp
// The pre-flight plan: what a Llama step on a mesh will hold per device and move per step,
// computed from the config and mesh alone, before any tensor is allocated.
//
//   auto mesh = MeshShape({"dp", "fsdp", "ep", "tp", "sp"}, {1, 2, 1, 2, 1});   // "ep" may be left out
//   MemoryPlan p = plan_llama(LlamaConfig::preset("gqa1b"), mesh, {.batch = 8, .seq = 1024, .train = true});
//   p.parameter_bytes, p.gradient_bytes, p.optimizer_state_bytes, p.activation_peak_bytes, p.collectives
//
// Parameters, gradients and the ZeRO-3 transients come from sharded_param_plans, the same
// layouts ShardedLlama stores and gathers, so they equal what the mesh's MemoryTracker
// measures (tests/models/test_plan.cpp). Device 0 holds the largest blocks (a dimension its
// axes do not divide ends in shorter blocks on the last devices; a mixture-of-experts model's
// ep ranks hold E / ep experts each), so its figures bound every device's.
//
// Activations (f32, per device; Bl = B / (dp*fsdp*ep) local rows, Sl = S / sp local positions,
// Tl = Bl*Sl local tokens, Tf = Bl*S the tokens attention sees, nh = heads/tp, nkv = kv
// heads/tp, D = head_dim, Fl = intermediate/tp, L layers), from what ShardedLlama::device_step
// and the modules' Saved structs keep:
//   per layer, kept until the layer's backward:
//     LayerSaved n1, h, n2                         3 Tl H
//     LayerSaved g (sp > 1: the sp-gathered n1)    Tf H
//     RMSNorm inv_rms x 2                          2 Tl
//     Attention q, ctx / k, v / cos+sin / lse      2 Tf nh D + 2 Tf nkv D + Tf D + Tf nh
//     qk_norm (Qwen3): q, k before the norms and
//       their inv_rms                              Tf nh D + Tf nkv D + Tf nh + Tf nkv
//     MLP g, u, a                                  3 Tl Fl
//     or a mixture-of-experts block (E experts, top K, expert width Fe; a device's experts run
//       over K Tl rows when the routing is balanced): router logits and probabilities
//       2 Tl E, routing weights K Tl, token/slot ids and top-k 2 K Tl int64, expert inputs and
//       outputs 2 K Tl H, the experts' g, u, a 3 K Tl Fe; a shared expert (width Fs) adds
//       3 Tl Fs + Tl H + Tl
//     sandwich norms (Gemma): attention and MLP
//       outputs and their inv_rms                  2 Tl H + 2 Tl
//   whole step: residual stream xs (L+1) Tl H, final hidden Tl H (+ dhidden Tl H when
//     training), final norm inv_rms Tl, token ids / targets / embedding ids 3 Tl int64.
//   the sparse layers' routing, copied for the router losses: 2 Tl E + K Tl floats and 2 K Tl
//     int64 per sparse layer;
//   with remat (training) or without training, one layer's saved state (the largest) instead
//     of all layers': peak = whole step + routing + max(loss transient, layer + backward
//     transient); remat also repeats each layer's forward collectives in backward;
//   the peak adds the largest transient on top of all layers' saved state:
//     loss:     the chunked loss's [C, V] f32 logits + 3 C doubles (C = min(chunk_rows, Tl));
//               the full [Tl, V] logits never exist;
//     backward of the last layer (training): outer a, b and inner a, dh (4 Tl H) plus
//               max(MLP: da, dg 2 Tl Fl;
//                   attention: dg Tf H (+ its sp-padded input Tf H when sp > 1) plus
//                     max(dctx, dq 2 Tf nh D + dk, dv 2 Tf nkv D + p, dp scratch 2 * 64 * S
//                         per worker thread;  sp > 1: the reduce_scatter's packed Tf H + out Tl H)).
// Collectives, per device and step (ring algorithms; g = group size, n = one device's buffer):
//   all_gather sends (g-1) n, reduce_scatter (out n) sends (g-1) n, psum sends 2 (g-1)/g n,
//   all_to_all sends (g-1)/g n. A sparse layer on ep > 1 exchanges its K Tl rows of H floats
//   twice in forward (to the experts and back) and twice more in backward (balanced routing: the
//   padded chunks hold K Tl / ep rows each; a skewed routing pads them up to the busiest pair).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/mesh/mesh_shape.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/nn/attention.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/tensor/partition_rules.hpp>

namespace edl::models {

struct PlanOptions {
  std::int64_t batch = 1, seq = 1;  // the global batch [B, S]
  bool train = false;               // forward + loss + backward (+ optimizer state); else the loss only
  optim::OptimizerOptions optimizer{};  // which state slots (sgd: momentum > 0 keeps a buffer)
  DType param_dtype = DType::f32;   // storage of the parameters (bf16: the optimizer adds an f32 master)
  std::int64_t threads = 1;         // worker threads per device (attention backward scratch)
  std::int64_t chunk_rows = 1024;   // nn::LossOptions::chunk_rows
  bool remat = false;               // training runs each layer again before its backward
                                    // (nothing_saveable, ShardedLlama::set_remat)
  PartitionRules rules = llama_partition_rules();
};

/// One kind of collective call in a step, on one axis group.
struct PlannedCollective {
  std::string op;                    // all_gather, reduce_scatter, psum
  std::vector<std::string> axes;     // the group's axes (mesh order)
  std::int64_t group = 1;            // devices in the group
  std::int64_t calls = 0;            // per step
  std::int64_t payload_bytes = 0;    // per device and step: the buffer each device contributes
  std::int64_t wire_bytes = 0;       // per device and step: bytes a ring sends
  std::string what;                  // parameters, gradients, activations, loss
};

struct MemoryPlan {
  std::int64_t devices = 1;
  std::int64_t parameters = 0;            // elements of the whole model
  // Per device, persistent:
  std::int64_t parameter_bytes = 0;       // this device's parameter blocks
  std::int64_t gradient_bytes = 0;        // f32 gradient blocks (training)
  std::int64_t optimizer_state_bytes = 0; // f32 state of this device's blocks (training)
  // Per device, transient within a step:
  std::int64_t gathered_bytes = 0;        // ZeRO-3: embedding/norm/lm_head plus the largest layer, gathered (and their local f32 grads when training)
  std::int64_t activation_peak_bytes = 0; // see the formula above
  std::int64_t staging_bytes = 0;         // the largest packed buffer of one parameter's gather or gradient reduce-scatter
  std::int64_t peak_bytes = 0;            // sum of the above
  std::int64_t expert_parameter_bytes = 0;  // of parameter_bytes: the experts this device holds (MoE)
  // Per device: batch rows, positions, tokens.
  std::int64_t local_batch = 0, local_seq = 0, local_tokens = 0;
  std::vector<PlannedCollective> collectives;
  /// wire bytes per axis group ("fsdp", "fsdp+sp", ...) per step.
  std::map<std::string, std::int64_t> wire_bytes_by_axes() const {
    std::map<std::string, std::int64_t> m;
    for (const auto& c : collectives) {
      std::string k;
      for (const auto& a : c.axes) k += (k.empty() ? "" : "+") + a;
      m[k] += c.wire_bytes;
    }
    return m;
  }
};

namespace plan_detail {

inline std::int64_t elements(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

/// f32 optimizer state for one block of `shape` (optimizer.hpp's slots).
inline std::int64_t optimizer_state_elements(const optim::OptimizerOptions& o, const std::vector<std::int64_t>& shape,
                                             bool master) {
  const std::int64_t n = elements(shape);
  std::int64_t s = master ? n : 0;  // f32 master copy of non-f32 parameters
  switch (o.kind) {
    case optim::OptimizerKind::adamw: return s + 2 * n;  // exp_avg, exp_avg_sq
    case optim::OptimizerKind::sgd: return s + (o.momentum > 0 ? n : 0);  // momentum_buffer
    case optim::OptimizerKind::lion: return s + n;  // exp_avg
    case optim::OptimizerKind::rmsprop:  // square_avg, momentum_buffer, grad_avg
      return s + n + (o.momentum > 0 ? n : 0) + (o.rmsprop_centered ? n : 0);
    case optim::OptimizerKind::adafactor:
      if (shape.size() >= 2) return s + n / shape.back() + shape.back();  // row and column means
      return s + n;
  }
  return s;
}

class Collectives {
 public:
  explicit Collectives(const MeshShape& ms) : ms_(ms) {}
  void add(const std::string& op, std::vector<std::string> axes, std::int64_t bytes, std::int64_t calls,
           const std::string& what) {
    std::vector<std::string> ordered;  // mesh order, size-1 axes dropped (no traffic)
    for (const auto& a : ms_.names())
      if (std::find(axes.begin(), axes.end(), a) != axes.end() && ms_.axis_size(a) > 1) ordered.push_back(a);
    if (ordered.empty() || calls == 0) return;
    std::int64_t g = 1;
    for (const auto& a : ordered) g *= ms_.axis_size(a);
    std::int64_t wire = op == "psum" ? 2 * (g - 1) * bytes / g : op == "all_to_all" ? (g - 1) * bytes / g : (g - 1) * bytes;
    for (auto& c : list_)
      if (c.op == op && c.axes == ordered && c.what == what) {
        c.calls += calls;
        c.payload_bytes += bytes * calls;
        c.wire_bytes += wire * calls;
        return;
      }
    list_.push_back({op, ordered, g, calls, bytes * calls, wire * calls, what});
  }
  std::vector<PlannedCollective> take() { return std::move(list_); }

 private:
  const MeshShape& ms_;
  std::vector<PlannedCollective> list_;
};

}  // namespace plan_detail

/// The per-device memory and per-step communication of a Llama step on `mesh` (axes dp, fsdp,
/// tp, sp). Validates exactly what shard_model and the step validate (heads, kv heads and
/// intermediate size by tp, each rule's dimensions by its axes, batch by dp * fsdp, sequence
/// by sp), with the same edl::Error messages. A tied config has no lm_head block.
inline MemoryPlan plan_llama(const LlamaConfig& cfg, const MeshShape& mesh, const PlanOptions& opt = {}) {
  const std::int64_t dp = mesh.axis_size("dp"), fsdp = mesh.axis_size("fsdp"), tp = mesh.axis_size("tp"),
                     sp = mesh.axis_size("sp"), ep = mesh_axis_or_one(mesh, "ep");
  const auto plans = sharded_param_plans(cfg, mesh, opt.rules, cfg.tie_word_embeddings);
  check_data_split(opt.batch, opt.seq, dp, fsdp, ep, sp, "plan");
  EDL_CHECK(opt.threads > 0, errc::invalid_argument, "plan", "threads must be positive, found ", opt.threads);
  EDL_CHECK(opt.chunk_rows > 0, errc::invalid_argument, "plan", "chunk_rows must be positive, found ", opt.chunk_rows);
  const std::int64_t sT = static_cast<std::int64_t>(dtype_size(opt.param_dtype));
  const bool master = opt.param_dtype != DType::f32;

  MemoryPlan r;
  r.devices = mesh.size();
  r.parameters = cfg.parameter_count();
  plan_detail::Collectives coll(mesh);

  // ---- persistent blocks, and the ZeRO-3 transients (globals kept all step, one layer at a time)
  std::int64_t global_compute = 0, layer_compute = 0;
  std::map<std::int64_t, std::int64_t> layer_elems;  // layer -> compute elements
  const std::int64_t L = cfg.num_hidden_layers;
  // A mesh of one device runs the one-device model in place: nothing is gathered or staged.
  const bool in_place = mesh.size() == 1;
  for (const auto& [name, p] : plans) {
    // Device 0's share: an expert sits on one ep rank, and every rank holds as many.
    const std::int64_t blk = p.layout.local_elements(0), comp = p.compute.local_elements(0);
    r.parameter_bytes += blk * sT;
    if (p.expert >= 0) r.expert_parameter_bytes += blk * sT;
    if (opt.train) {
      r.gradient_bytes += blk * 4;
      r.optimizer_state_bytes += 4 * plan_detail::optimizer_state_elements(opt.optimizer, p.layout.local_shape(0), master);
    }
    const bool in_layer = name.rfind("model.layers.", 0) == 0;
    if (in_layer) layer_elems[std::stoll(name.substr(13))] += comp;
    else global_compute += comp;
    // Gathered before use: globals once per step, a layer's parameters in forward and again in backward.
    const std::int64_t gathers = in_layer && opt.train ? 2 : 1;
    coll.add("all_gather", p.gather_axes, blk * sT, gathers, "parameters");
    if (opt.train) {
      if (!p.scatter_axes.empty()) coll.add("reduce_scatter", p.scatter_axes, blk * 4, 1, "gradients");
      if (!p.sum_axes.empty()) coll.add("psum", p.sum_axes, blk * 4, 1, "gradients");
    }
    // Collective staging, one parameter at a time (ShardedLlama::gather_param_into /
    // reduce_grad): blocks that are not row slabs of the compute tensor are gathered into, and
    // their gradient packed into, a buffer of the compute tensor's size; every reduced
    // gradient lands in a block-sized buffer first.
    if (in_place) continue;
    const std::int64_t m = p.layout.block_elements();
    const bool reduced = opt.train && !p.frozen;
    if (!p.gather_axes.empty()) {
      const auto group = mesh.group(0, std::span<const std::string>(p.gather_axes)).devices;
      const std::int64_t k = static_cast<std::int64_t>(group.size());
      const bool packed = !blocks_are_row_slabs(p, group, 0);
      r.staging_bytes = std::max(r.staging_bytes, packed ? m * k * sT : 0);
      if (reduced) r.staging_bytes = std::max(r.staging_bytes, (packed ? m * k * 4 : 0) + m * 4);
    } else if (reduced) {
      r.staging_bytes = std::max(r.staging_bytes, m * 4);
    }
  }
  for (const auto& [l, e] : layer_elems) layer_compute = std::max(layer_compute, e);
  const std::int64_t per_elem = opt.train ? sT + 4 : sT;  // gathered value, plus its local grad when training
  if (!in_place) r.gathered_bytes = (global_compute + layer_compute) * per_elem;

  // ---- activations
  const std::int64_t Bl = opt.batch / (dp * fsdp * ep), S = opt.seq, Sl = S / sp, Tl = Bl * Sl, Tf = Bl * S;
  const std::int64_t H = cfg.hidden_size, D = cfg.head_size(), nh = cfg.num_attention_heads / tp,
                     nkv = cfg.num_key_value_heads / tp, Fl = cfg.intermediate_size / tp, V = cfg.vocab_size;
  r.local_batch = Bl;
  r.local_seq = Sl;
  r.local_tokens = Tl;
  const std::int64_t f = 4, i64 = 8;
  const std::int64_t qk_norm = cfg.qk_norm() ? Tf * nh * D + Tf * nkv * D + Tf * nh + Tf * nkv : 0;
  const std::int64_t sandwich = cfg.sandwich_norms() ? 2 * Tl * H + 2 * Tl : 0;
  // A sparse layer keeps its routing and its experts' rows instead of the MLP's g, u, a.
  const std::int64_t E = cfg.is_moe() ? cfg.num_local_experts : 0, K = cfg.is_moe() ? cfg.num_experts_per_tok : 0;
  const std::int64_t Fe = cfg.expert_intermediate_size(), Fs = cfg.shared_expert_size();
  const std::int64_t sparse_block = f * (2 * Tl * E + K * Tl + 2 * K * Tl * H + 3 * K * Tl * Fe +
                                         (Fs > 0 ? 3 * Tl * Fs + Tl * H + Tl : 0)) +
                                    i64 * 2 * K * Tl;
  const std::int64_t attn_layer = f * (3 * Tl * H + (sp > 1 ? Tf * H : 0) + 2 * Tl + 2 * Tf * nh * D +
                                       2 * Tf * nkv * D + Tf * D + Tf * nh + qk_norm + sandwich);
  std::int64_t layers_saved = 0, layer_max = 0, sparse_layers = 0;
  for (std::int64_t l = 0; l < L; ++l) {
    const bool sparse = cfg.layer_is_sparse(l);
    sparse_layers += sparse ? 1 : 0;
    const std::int64_t saved = attn_layer + (sparse ? sparse_block : f * 3 * Tl * Fl);
    layers_saved += saved;
    layer_max = std::max(layer_max, saved);
  }
  // Every layer's state is kept until its backward only when training without remat; else one
  // layer's at a time (the one running, or being run again before its backward). The sparse
  // layers' routing is kept apart for the router losses whenever the step has a loss.
  const bool keep_layers = opt.train && !opt.remat;
  const std::int64_t routes = sparse_layers * (f * (2 * Tl * E + K * Tl) + i64 * 2 * K * Tl);
  const std::int64_t step = f * ((L + 1) * Tl * H + Tl * H + (opt.train ? Tl * H : 0) + Tl) + i64 * 3 * Tl;
  const std::int64_t C = std::min(opt.chunk_rows, Tl);
  const std::int64_t loss_transient = f * C * V + 8 * 3 * C + C;
  std::int64_t transient = loss_transient, backward = 0;  // backward: the last layer's, on top of the saved state
  if (opt.train) {
    const std::int64_t QB = kernels::kAttentionQueryBlock;
    const std::int64_t workers = std::min(opt.threads, Bl * nkv);
    const std::int64_t mlp = sparse_layers > 0 ? 2 * K * Tl * (H + Fe) : 2 * Tl * Fl;  // a sparse block: dy, dx rows
    // dg and (sp) its padded input stay while the attention backward's own buffers come and
    // go, and then the sp reduce_scatter's packed copy and output.
    const std::int64_t attn = Tf * H + (sp > 1 ? Tf * H : 0) +
                              std::max(2 * Tf * nh * D + 2 * Tf * nkv * D + workers * 2 * QB * S,
                                       sp > 1 ? Tf * H + Tl * H : std::int64_t{0});
    backward = f * (4 * Tl * H + std::max(mlp, attn));
    transient = std::max(transient, backward);
  }
  r.activation_peak_bytes = keep_layers ? layers_saved + step + routes + transient
                                        : step + routes + std::max(loss_transient, layer_max + backward);
  r.peak_bytes = r.parameter_bytes + r.gradient_bytes + r.optimizer_state_bytes + r.gathered_bytes +
                 r.activation_peak_bytes + r.staging_bytes;

  // ---- activation collectives, per layer (ShardedLlama::layer_forward / layer_backward)
  const std::int64_t act = f * Tl * H;
  const std::int64_t passes = opt.train ? 1 : 0;
  const std::int64_t forwards = opt.train && opt.remat ? 2 : 1;            // remat runs each layer twice
  coll.add("all_gather", {"sp"}, act, L * forwards, "activations");          // normed input before attention
  coll.add("psum", {"tp"}, act, 2 * L * forwards, "activations");            // after o_proj and down_proj
  coll.add("psum", {"tp"}, act, 2 * L * passes, "activation gradients");    // column-parallel input gradients
  coll.add("reduce_scatter", {"sp"}, act, L * passes, "activation gradients");  // attention input gradient
  if (sparse_layers > 0 && ep > 1) {  // token rows to the experts' ranks and back (nn::ExpertParallel)
    const std::int64_t rows = f * K * Tl * H;
    coll.add("all_to_all", {"ep"}, rows, 2 * sparse_layers * forwards, "expert rows");
    coll.add("all_to_all", {"ep"}, rows, 2 * sparse_layers * passes, "expert row gradients");
    coll.add("all_to_all", {"ep"}, i64 * E, sparse_layers * forwards, "expert row counts");
  }
  // loss: the valid-token count and the five metric sums over the data axes
  coll.add("psum", {"dp", "fsdp", "ep", "sp"}, i64, 1, "loss");
  coll.add("psum", {"dp", "fsdp", "ep", "sp"}, 5 * 8, 1, "loss");
  r.collectives = coll.take();
  return r;
}

}  // namespace edl::models
