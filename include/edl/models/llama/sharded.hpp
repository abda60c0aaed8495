// edl/models/llama/sharded.hpp
// Llama forward and backward on a device mesh (dp, fsdp, ep, tp, sp >= 1) giving the logits,
// loss and gradients of one device (docs/parallelism.md).
//
//   auto mesh = create_mesh({2, 2, 2, 1});                    // dp=2, fsdp=2, tp=2
//   auto sm = models::shard_model(model, mesh);                // llama_partition_rules()
//   auto logits = sm.logits(tokens.data(), B, S);              // [B, S, V], gathered
//   nn::LossMetrics m = sm.loss_and_grads(tokens.data(), labels.data(), B, S);   // grads +=
//   xt::xarray<float> g = sm.gather_grad("model.layers.0.mlp.up_proj.weight");
//   LlamaForCausalLM<> back = models::gather_model(sm);        // bit-exact round trip
//
// Storage. Every parameter is a ShardedArray<T> laid out by the partition rules (so the mesh's
// MemoryTracker counts each device's blocks: fsdp=N holds ~1/N of the matrices per device);
// gradients (f32) are ShardedArray<float> with the same layout, allocated by the first
// loss_and_grads and ACCUMULATED by each call (zero_grad() clears them), as
// LlamaForCausalLM::forward_backward does.
//
// Execution, per device inside mesh.run (one simulated device per thread):
//  - a local LlamaForCausalLM whose config has num_attention_heads / tp, num_key_value_heads / tp
//    and intermediate_size / tp (head_dim explicit), built once per device; its parameter
//    values are empty except while a layer runs;
//  - ZeRO-3: before a layer runs (forward, and again in backward) each of its parameters is
//    all_gathered over the axes that shard it except tp ("fsdp", "sp", "dp" if a rule uses it),
//    keeping the tp block local; embedding, final norm and lm_head are gathered over every axis
//    that shards them (tp included) at the start of the step and kept until its end (the
//    vocabulary-parallel head is not implemented: the head is replicated compute);
//  - data: the batch is split over (dp, fsdp, ep) (B divisible by dp * fsdp * ep), the sequence
//    over sp (S divisible by sp);
//  - expert parallel (mixture-of-experts models): expert e of E is stored and run on the ep rank
//    e / (E / ep) only (a placed layout, ShardLayout::placed_on; the rules may split it further
//    over fsdp); each device routes its own tokens and exchanges their rows with the experts'
//    ranks by all_to_all (nn::ExpertParallel). An expert's gradient is complete on its ep rank
//    (every row of the ep group reached it) and sums over the other data axes only. The router
//    losses sum their counts over every data axis, so they are the whole batch's. Experts are
//    not split over tp (a MoE model on a mesh needs tp = 1);
//  - tensor parallel: q/k/v/gate/up column-parallel (local heads / rows of F), o_proj and
//    down_proj row-parallel followed by psum over "tp"; in backward the input gradients of the
//    column-parallel projections are psummed over "tp"; a row-parallel bias is added by tp
//    rank 0 only;
//  - sequence parallel: norms and MLP run on the local tokens; before attention the normed
//    hidden states are all_gathered over "sp", attention runs on the whole sequence and keeps
//    the local slice; in backward the gradient of the gathered input is reduce_scattered over
//    "sp" (each rank back-propagates only its own outputs);
//  - loss: the HF shift is applied globally before splitting, each device sums its tokens and
//    divides by the global count (psum over dp, fsdp, sp), so the loss is the one-device mean;
//  - gradients: right after a layer's backward, each parameter's (tp-local) gradient is
//    reduce_scattered over the data axes that shard it and psummed over the data axes that do
//    not, so each device's block equals the block of the one-device gradient. Qwen3's per-head
//    q_norm / k_norm weights are replicated but each tp rank's gradient comes from its own
//    heads only, so theirs is psummed over tp as well.
//  - LoRA: a model with adapters (lora::apply_lora) shards them with their base: lora_B takes
//    the base's split of the output rows, lora_A its split of the input columns, r is never
//    split. Only the adapters are trainable (gradients, optimizer state); the base is frozen.
//    On a column-parallel base every tp rank computes the same u = x A^T, so the gradient of
//    A is a sum over tp; on a row-parallel base each rank adds its partial u_r B^T before the
//    psum, so the gradient of B is. Dropout draws each element's mask from its place in the
//    whole batch (nn::DropoutIndex), so a mesh drops what one device drops.
// Collectives reduce in group order, so results are deterministic for a given mesh.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/rng.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/lora/apply.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/expert_parallel.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/module.hpp>
#include <edl/tensor/partition_rules.hpp>
#include <edl/tensor/sharded_tensor.hpp>

namespace edl::models {

namespace sharded_detail {

/// Axes that split the data: the batch over (dp, fsdp, ep), the sequence over sp.
inline const std::vector<std::string>& data_axes() {
  static const std::vector<std::string> a{"dp", "fsdp", "ep", "sp"};
  return a;
}

/// J for a parameter of expert J of a mixture-of-experts block ("...experts.J.w1.weight", its
/// adapters too), else -1 (the router and a shared expert belong to no expert).
inline std::int64_t expert_index(const std::string& name) {
  const std::string key = ".experts.";
  const std::size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  std::size_t i = at + key.size();
  std::int64_t j = 0;
  bool digits = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i, digits = true) j = j * 10 + (name[i] - '0');
  return digits && i < name.size() && name[i] == '.' ? j : -1;
}

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}

/// `spec` with only the axes in `keep` left.
inline SpecValue restrict_spec(const SpecValue& spec, const std::vector<std::string>& keep) {
  SpecValue r;
  for (const auto& d : spec.dims) {
    std::vector<std::string> k;
    for (const auto& a : d)
      if (contains(keep, a)) k.push_back(a);
    r.dims.push_back(std::move(k));
  }
  return r;
}

inline std::vector<std::int64_t> minus(std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

template <class X>
void free_tensor(X& x) {
  typename X::shape_type z{};
  x = X::from_shape(z);
}

}  // namespace sharded_detail

/// The size of `axis`, or 1 on a mesh without it (a MeshShape built without "ep").
inline std::int64_t mesh_axis_or_one(const MeshShape& ms, std::string_view axis) {
  return ms.has_axis(axis) ? ms.axis_size(axis) : 1;
}

/// The local (per-device) config: heads and intermediate size divided by tp, head_dim explicit.
inline LlamaConfig tp_local_config(const LlamaConfig& c, std::int64_t tp) {
  const char* w = "ShardedLlama";
  EDL_CHECK(c.num_attention_heads % tp == 0, errc::not_divisible, w, "num_attention_heads (", c.num_attention_heads,
            ") is not divisible by tp = ", tp);
  EDL_CHECK(c.num_key_value_heads % tp == 0, errc::not_divisible, w, "num_key_value_heads (", c.num_key_value_heads,
            ") is not divisible by tp = ", tp, " (each tp rank needs whole kv heads)");
  EDL_CHECK(c.intermediate_size % tp == 0, errc::not_divisible, w, "intermediate_size (", c.intermediate_size,
            ") is not divisible by tp = ", tp);
  LlamaConfig l = c;
  l.head_dim = c.head_size();
  l.num_attention_heads = c.num_attention_heads / tp;
  l.num_key_value_heads = c.num_key_value_heads / tp;
  l.intermediate_size = c.intermediate_size / tp;
  return l;
}

/// The data split every step checks: the batch over dp * fsdp * ep, the sequence over sp.
inline void check_data_split(std::int64_t B, std::int64_t S, std::int64_t dp, std::int64_t fsdp, std::int64_t ep,
                             std::int64_t sp, const char* w = "ShardedLlama") {
  EDL_CHECK(B > 0 && S > 0, errc::invalid_argument, w, "batch and seq must be positive, found ", B, ", ", S);
  EDL_CHECK(B % (dp * fsdp * ep) == 0, errc::not_divisible, w, "batch ", B, " is not divisible by dp * fsdp * ep = ",
            dp, " * ", fsdp, " * ", ep, " = ", dp * fsdp * ep, " (the batch is split over dp, fsdp and ep)");
  EDL_CHECK(S % sp == 0, errc::not_divisible, w, "sequence length ", S, " is not divisible by sp = ", sp,
            " (the sequence is split over sp)");
}

/// How one parameter is stored and moved on a mesh. ShardedLlama executes exactly this, and
/// plan_llama (plan.hpp) counts bytes from it, so the two cannot disagree.
struct ShardedParamPlan {
  ShardLayout layout;   // the stored blocks
  ShardLayout compute;  // the tensor the local model uses (tp block or full)
  std::vector<std::string> gather_axes, scatter_axes, sum_axes;  // axes of size > 1 only, mesh order
  bool row_bias = false;  // added by tp rank 0 only
  bool frozen = false;    // no gradient and no optimizer state (the base of a LoRA model)
  std::int64_t expert = -1;  // a mixture-of-experts expert's parameter: its index (placed on its ep rank)
};

/// Whether the blocks of `group` (device ids in group order) are consecutive slabs of rows of
/// device d's compute tensor: then the buffer of a collective over the group is that tensor
/// (fsdp's usual split of dimension 0), and nothing is packed or unpacked around it; else the
/// collective goes through a packed buffer of the compute tensor's size (plan_llama counts it).
inline bool blocks_are_row_slabs(const ShardedParamPlan& pl, const std::vector<std::int64_t>& group, std::int64_t d) {
  const auto& cshape = pl.compute.block_shape();
  const auto& bshape = pl.layout.block_shape();
  if (!pl.layout.even() || cshape.empty() || bshape[0] * static_cast<std::int64_t>(group.size()) != cshape[0])
    return false;
  for (std::size_t i = 1; i < cshape.size(); ++i)
    if (bshape[i] != cshape[i]) return false;
  const auto origin = pl.compute.offset(d);
  for (std::size_t k = 0; k < group.size(); ++k) {
    const auto at = sharded_detail::minus(pl.layout.offset(group[k]), origin);
    if (at[0] != static_cast<std::int64_t>(k) * bshape[0]) return false;
    for (std::size_t i = 1; i < at.size(); ++i)
      if (at[i] != 0) return false;
  }
  return true;
}

/// The Linears of a model that carry LoRA adapters: path ("model.layers.0.self_attn.q_proj") -> r.
using AdapterRanks = std::map<std::string, std::int64_t>;

/// Every parameter's plan, in HF order (a tied lm_head has none: it is the embedding); with
/// `adapters`, each adapted Linear's lora_A / lora_B follow its weight, and every other
/// parameter is frozen. Validates the config against the mesh (heads, kv heads,
/// intermediate size by tp; each rule's dimensions by its axes) with the errors of
/// tp_local_config and PartitionRules.
inline std::vector<std::pair<std::string, ShardedParamPlan>> sharded_param_plans(const LlamaConfig& cfg,
                                                                                const MeshShape& ms,
                                                                                const PartitionRules& rules,
                                                                                bool tied,
                                                                                const AdapterRanks& adapters = {}) {
  cfg.validate();
  const std::int64_t tp = ms.axis_size("tp"), ep = mesh_axis_or_one(ms, "ep");
  if (cfg.is_moe()) {
    EDL_CHECK(tp == 1, errc::unsupported, "ShardedLlama", "a mixture-of-experts model (", cfg.model_type,
              ") splits its experts over ep, not over tp; found tp = ", tp, " (use ep, fsdp, dp or sp)");
    EDL_CHECK(cfg.num_local_experts % ep == 0, errc::not_divisible, "ShardedLlama", "num_local_experts (",
              cfg.num_local_experts, ") is not divisible by ep = ", ep, " (each ep rank holds whole experts)");
  }
  const LlamaConfig local_cfg = tp_local_config(cfg, tp);
  const auto global = cfg.parameter_shapes();
  const auto local = local_cfg.parameter_shapes();
  EDL_CHECK(global.size() == local.size(), errc::shape_mismatch, "ShardedLlama", "parameter lists differ");
  std::vector<std::pair<std::string, ShardedParamPlan>> plans;
  const std::vector<std::string> kept_tp{"tp"};
  // partial_over_tp: the parameter is whole on every tp rank while each rank's gradient is a
  // share of the full one (a per-head norm over the rank's heads; an adapter factor over a
  // tp-split base), so the gradient sums over tp.
  const auto plan = [&](const std::string& name, const SpecValue& spec, const std::vector<std::int64_t>& gshape,
                        const std::vector<std::int64_t>& lshape, bool partial_over_tp, bool frozen) {
    ShardedParamPlan p;
    p.expert = cfg.is_moe() ? sharded_detail::expert_index(name) : -1;
    p.layout = ShardLayout(ms, spec, gshape, name);
    const bool keep_tp = lshape != gshape;  // the local model holds a tp block of it
    p.compute = ShardLayout(ms, sharded_detail::restrict_spec(spec, keep_tp ? kept_tp : std::vector<std::string>{}),
                            gshape, name);
    if (p.expert >= 0 && ms.has_axis("ep")) {  // on its ep rank only
      const std::int64_t owner = nn::expert_owner(p.expert, cfg.num_local_experts, ep);
      p.layout = p.layout.placed_on("ep", owner);
      p.compute = p.compute.placed_on("ep", owner);
    }
    // A dimension the local model computes a tp block of must split evenly, over tp and over
    // any data axis that shares it (whole heads, equal MLP columns, and blocks that nest in
    // the tp block); storage alone may split a dimension unevenly (ShardLayout).
    if (keep_tp) {
      SpecValue tp_dims = spec;
      for (auto& d : tp_dims.dims)
        if (!sharded_detail::contains(d, "tp")) d.clear();
      tp_dims.check_divides(ms, gshape, name);
    }
    EDL_CHECK(p.compute.block_shape() == lshape, errc::unsupported, name, "spec ", spec.str(),
              " does not split this parameter the way tensor-parallel Llama computes it: the tp-local tensor has "
              "shape ",
              ::edl::detail::shape_str(p.compute.block_shape()), " but rank ", tp, " needs ",
              ::edl::detail::shape_str(lshape),
              " (column-parallel q/k/v/gate/up split dimension 0 over tp, row-parallel o/down dimension 1)");
    std::vector<std::string> g;
    for (const auto& d : spec.dims)
      for (const auto& a : d) {
        if (ms.axis_size(a) == 1) continue;
        if (keep_tp && a == "tp") continue;
        g.push_back(a);
      }
    // Group order is row-major in mesh order whatever the list order; keep mesh order anyway.
    for (const auto& a : ms.names())
      if (sharded_detail::contains(g, a)) p.gather_axes.push_back(a);
    for (const auto& a : ms.names()) {
      if (ms.axis_size(a) == 1) continue;
      if (a == "tp") {
        if (partial_over_tp && !keep_tp) p.sum_axes.push_back(a);
      } else if (sharded_detail::contains(sharded_detail::data_axes(), a)) {
        if (a == "ep" && p.expert >= 0) continue;  // every row of the ep group reached the expert
        if (sharded_detail::contains(p.gather_axes, a)) p.scatter_axes.push_back(a);
        else p.sum_axes.push_back(a);
      }
    }
    p.row_bias = name.ends_with("o_proj.bias") || name.ends_with("down_proj.bias");
    p.frozen = frozen;
    plans.emplace_back(name, std::move(p));
  };
  std::size_t adapted = 0;
  for (std::size_t i = 0; i < global.size(); ++i) {
    const auto& [name, gshape] = global[i];
    const auto& lshape = local[i].second;
    if (tied && name == "lm_head.weight") continue;
    const SpecValue spec = rules.spec_for(name, gshape, ms);
    plan(name, spec, gshape, lshape,
         name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight"), !adapters.empty());
    if (!name.ends_with(".weight")) continue;
    const std::string linear = name.substr(0, name.size() - 7);
    const auto it = adapters.find(linear);
    if (it == adapters.end()) continue;
    ++adapted;
    // lora_A [r, in] splits the base's input columns, lora_B [out, r] its output rows.
    const std::int64_t r = it->second;
    const bool column_parallel = lshape[0] != gshape[0], row_parallel = lshape[1] != gshape[1];
    plan(linear + ".lora_A.weight", SpecValue({{}, spec.dims[1]}), {r, gshape[1]}, {r, lshape[1]}, column_parallel,
         false);
    plan(linear + ".lora_B.weight", SpecValue({spec.dims[0], {}}), {gshape[0], r}, {lshape[0], r}, row_parallel, false);
  }
  EDL_CHECK(adapted == adapters.size(), errc::unsupported, "ShardedLlama", "of ", adapters.size(),
            " adapted Linears only ", adapted, " are decoder projections with a weight of their own");
  return plans;
}

template <class Pol = DefaultPolicy>
class ShardedLlama {
 public:
  using T = typename Pol::param_t;
  using Local = LlamaForCausalLM<Pol>;

  /// Gradient checkpointing with the one-device layer's policies (`drop`: remat::parse's or
  /// dropped_by's bits). nothing_saveable (HF's gradient_checkpointing=True) keeps each layer's
  /// input only and runs the whole layer again, collectives included, before its backward. A
  /// finer mask (dots_saveable, save_only_these_names(...), ...) frees the named activations
  /// after the layer's forward and recomputes them before its backward, with the collectives
  /// that made them (norm1's gather over sp, attn_out's sum over tp). Losses and gradients are
  /// bitwise those without remat.
  void set_remat(remat::DropMask drop) noexcept { drop_ = drop; }
  /// What a step's batch and sequence must be multiples of: the batch is split over
  /// dp x fsdp x ep, the sequence over sp (check_data_split).
  std::int64_t batch_multiple() const { return axis("dp") * axis("fsdp") * axis("ep"); }
  std::int64_t seq_multiple() const { return axis("sp"); }
  bool remat() const noexcept { return drop_ != 0; }
  remat::DropMask remat_mask() const noexcept { return drop_; }

  /// Shards `model`'s parameters over `mesh` by `rules`.
  ShardedLlama(const LlamaForCausalLM<Pol>& model, DefaultMesh mesh, PartitionRules rules = llama_partition_rules())
      : cfg_(model.config()), mesh_(std::move(mesh)), rules_(std::move(rules)), tied_(model.tied()) {
    auto& m = const_cast<LlamaForCausalLM<Pol>&>(model);  // visit_params is non-const; only read here
    AdapterRanks adapters;
    m.visit_linears("", [&](const std::string& path, auto& lin) {
      EDL_CHECK(!lin.is_quantized(), errc::unsupported, path,
                "is quantized (", quant::format_name(lin.qweight.format()),
                "): a model on a mesh holds float weights; quantized models and QLoRA run on one device");
      if (lin.lora) adapters.emplace(path, lin.lora->rank());
    });
    if (!adapters.empty()) lora_ = lora::config_of(m);
    setup(adapters);
    m.visit_params("", [&](std::string_view path, auto& p) {
      const std::string name(path);
      const xt::xarray<T> full = p.value;
      params_.emplace(name, shard(full, plans_.at(name).layout, mesh_.context()));
    });
  }
  /// A freshly initialized model, equal to LlamaForCausalLM::init(key) sharded: parameter k
  /// draws from fold_in(key, k) and element i from counter i (nn::init_params), so each
  /// process draws the blocks of its own devices and no process builds the whole model.
  ShardedLlama(const LlamaConfig& cfg, Key key, DefaultMesh mesh, PartitionRules rules = llama_partition_rules())
      : ShardedLlama(cfg, std::optional<Key>(key), std::move(mesh), std::move(rules)) {}
  /// A model of `cfg` whose stored blocks are zero, for a loader to fill
  /// (models::from_pretrained_sharded, train::load_sharded_state).
  ShardedLlama(const LlamaConfig& cfg, DefaultMesh mesh, PartitionRules rules = llama_partition_rules())
      : ShardedLlama(cfg, std::optional<Key>(), std::move(mesh), std::move(rules)) {}

  /// Adds LoRA adapters to a model that has none, as lora::apply_lora adds them to the
  /// one-device model (the same targets; A drawn from the same keys, B zero), so a model drawn
  /// or read straight into its blocks trains adapters without any process building the base.
  /// The base becomes frozen; gradients and the devices' working models start afresh.
  void add_adapters(const lora::LoraConfig& c, const std::string& where = "lora") {
    EDL_CHECK(!lora_, errc::invalid_argument, where, "the model already has LoRA adapters");
    LlamaForCausalLM<Pol> shapes(cfg_);  // its base is never written: only the adapters' pages are touched
    lora::apply_lora(shapes, c, where);
    AdapterRanks adapters;
    shapes.visit_linears("", [&](const std::string& path, auto& lin) {
      if (lin.lora) adapters.emplace(path, lin.lora->rank());
    });
    lora_ = lora::config_of(shapes);
    names_.clear();
    trainable_.clear();
    plans_.clear();
    data_axes_.clear();
    locals_.clear();
    grads_.clear();
    setup(adapters);
    visit_adapter_params(shapes, [&](const std::string& name, auto& p) {
      const xt::xarray<T> full = p.value;
      params_.emplace(name, shard(full, plans_.at(name).layout, mesh_.context()));
    });
  }
  /// The one-device model's structure with this model's adapters, gathered: what a LoRA
  /// checkpoint saves (lora::write_adapter_files). Its base weights are allocated and never
  /// written, so no page of them is touched: this costs the adapters' bytes.
  LlamaForCausalLM<Pol> gather_adapters() const {
    EDL_CHECK(lora_.has_value(), errc::invalid_argument, "ShardedLlama::gather_adapters", "the model has no adapters");
    LlamaForCausalLM<Pol> m(cfg_);
    lora::apply_lora(m, *lora_, "ShardedLlama");
    visit_adapter_params(m, [&](const std::string& name, auto& p) {
      const xt::xarray<T> full = gather(params_.at(name));
      std::memcpy(p.data(), full.data(), full.size() * sizeof(T));
    });
    return m;
  }

  const LlamaConfig& config() const noexcept { return cfg_; }
  /// As LlamaForCausalLM::fused_weight: where Linear `linear_path`'s weight lives in a
  /// checkpoint that fuses it with others (Phi-3), or nullopt.
  std::optional<FusedSlice> fused_weight(const std::string& linear_path) const {
    return fused_slice(config(), linear_path + ".weight");
  }
  const DefaultMesh& mesh() const noexcept { return mesh_; }
  bool tied() const noexcept { return tied_; }
  /// Parameter names, HF order (with adapters: each Linear's lora_A / lora_B after its weight).
  const std::vector<std::string>& names() const noexcept { return names_; }
  /// The parameters that get gradients and optimizer state: all of them, or with LoRA
  /// adapters the adapters alone.
  const std::vector<std::string>& trainable_names() const noexcept { return trainable_; }
  bool trainable(const std::string& name) const { return !plans_.at(checked(name)).frozen; }

  /// Whether the model carries LoRA adapters, and their config (lora::config_of).
  bool has_adapters() const noexcept { return lora_.has_value(); }
  const std::optional<lora::LoraConfig>& adapter_config() const noexcept { return lora_; }
  /// The adapters' dropout key for the next steps (lora::set_dropout's; none: no dropout).
  void set_adapter_dropout(std::optional<Key> key) noexcept { dropout_key_ = key; }
  /// Switches the adapters on or off (lora::set_adapters_active: off, the base alone).
  void set_adapters_active(bool on) noexcept { adapters_active_ = on; }
  /// The routers' input jitter key for the next steps (LlamaForCausalLM::set_router_jitter's;
  /// none: no jitter). Each device draws its tokens' factors from their places in the batch.
  void set_router_jitter(std::optional<Key> key) noexcept { jitter_key_ = key; }

  const ShardedArray<T>& param(const std::string& name) const { return params_.at(checked(name)); }
  ShardedArray<T>& param(const std::string& name) { return params_.at(checked(name)); }
  xt::xarray<T> gather_param(const std::string& name) const { return gather(param(name)); }

  bool has_grads() const noexcept { return !grads_.empty(); }
  const ShardedArray<float>& grad(const std::string& name) const {
    return const_cast<ShardedLlama*>(this)->grad(name);
  }
  ShardedArray<float>& grad(const std::string& name) {
    EDL_CHECK(has_grads(), errc::invalid_argument, "ShardedLlama::grad", "no gradients yet: call loss_and_grads first");
    EDL_CHECK(trainable(name), errc::invalid_argument, name, "is frozen (the base of a LoRA model): it has no gradient");
    return grads_.at(name);
  }
  /// The full gradient of one parameter (gathered from the devices' blocks).
  xt::xarray<float> gather_grad(const std::string& name) const { return gather(grad(name)); }
  /// Every gradient (of the trainable parameters), gathered, by HF name.
  std::map<std::string, xt::xarray<float>> gather_grads() const {
    std::map<std::string, xt::xarray<float>> g;
    for (const auto& n : trainable_) g.emplace(n, gather_grad(n));
    return g;
  }
  void zero_grad() {
    for (auto& [n, g] : grads_)
      for (std::int64_t d = 0; d < mesh_.size(); ++d) g.local(d).fill(0.0f);
  }

  /// Bytes of parameter blocks device `d` holds.
  std::int64_t param_bytes(std::int64_t d) const {
    std::int64_t b = 0;
    for (const auto& [n, p] : params_) b += static_cast<std::int64_t>(p.local(d).size() * sizeof(T));
    return b;
  }

  /// Logits [B, S, V] of tokens [B, S] (row-major), gathered from the devices. Optional
  /// attention_mask, position_ids and segment_ids are [B, S] as in nn::TokenLayout (HF padding
  /// mask; packed documents).
  xt::xtensor<float, 3> logits(const std::int64_t* tokens, std::int64_t batch, std::int64_t seq,
                               const std::int64_t* attention_mask = nullptr, const std::int64_t* position_ids = nullptr,
                               const std::int64_t* segment_ids = nullptr) {
    return logits(tokens, nn::TokenLayout{batch, seq, position_ids, attention_mask, segment_ids});
  }
  xt::xtensor<float, 3> logits(const xt::xtensor<std::int64_t, 2>& tokens) {
    return logits(tokens.data(), static_cast<std::int64_t>(tokens.shape(0)), static_cast<std::int64_t>(tokens.shape(1)));
  }

  /// Loss only. labels [B, S] (null: tokens), HF shift applied.
  nn::LossMetrics loss(const std::int64_t* tokens, const std::int64_t* labels, std::int64_t batch, std::int64_t seq,
                       const nn::LossOptions& opt = {}, const std::int64_t* attention_mask = nullptr,
                       const std::int64_t* position_ids = nullptr, const std::int64_t* segment_ids = nullptr) {
    return loss(tokens, nn::TokenLayout{batch, seq, position_ids, attention_mask, segment_ids}, labels, opt);
  }

  /// Forward, loss and backward; ACCUMULATES the sharded gradients. labels null: tokens.
  nn::LossMetrics loss_and_grads(const std::int64_t* tokens, const std::int64_t* labels, std::int64_t batch,
                                 std::int64_t seq, const nn::LossOptions& opt = {},
                                 const std::int64_t* attention_mask = nullptr, const std::int64_t* position_ids = nullptr,
                                 const std::int64_t* segment_ids = nullptr) {
    return loss_and_grads(tokens, nn::TokenLayout{batch, seq, position_ids, attention_mask, segment_ids}, labels, opt);
  }
  nn::LossMetrics loss_and_grads(const xt::xtensor<std::int64_t, 2>& tokens, const xt::xtensor<std::int64_t, 2>& labels,
                                 const nn::LossOptions& opt = {}) {
    EDL_CHECK(tokens.shape() == labels.shape(), errc::shape_mismatch, "ShardedLlama::loss_and_grads",
              "tokens and labels must have the same shape");
    return loss_and_grads(tokens.data(), labels.data(), static_cast<std::int64_t>(tokens.shape(0)),
                          static_cast<std::int64_t>(tokens.shape(1)), opt);
  }

  /// A copy of this process's parameter blocks and the model's structure, without gradients
  /// or the devices' working models: what a checkpoint written in the background saves while
  /// training moves the parameters on (costs this process's parameter bytes once more).
  ShardedLlama snapshot() const { return ShardedLlama(*this, SnapshotTag{}); }

  /// As LlamaForCausalLM's logits, loss and forward_backward, with a TokenLayout: its padding
  /// mask, positions and documents, and inputs_embeds ([batch * seq, hidden] in place of the
  /// ids' embeddings; the ids may then be null and a loss needs its labels). loss_and_grads
  /// ACCUMULATES d loss / d inputs_embeds into layout.inputs_embeds_grad (when given; the
  /// embedding table then gets no gradient), on every process of the mesh.
  xt::xtensor<float, 3> logits(const std::int64_t* tokens, const nn::TokenLayout& layout) {
    xt::xtensor<float, 3> out = xt::xtensor<float, 3>::from_shape({static_cast<std::size_t>(layout.batch),
                                                                    static_cast<std::size_t>(layout.seq),
                                                                    static_cast<std::size_t>(cfg_.vocab_size)});
    run_step(tokens, nullptr, layout, nn::LossOptions{}, Mode::logits, out.data());
    return out;
  }
  nn::LossMetrics loss(const std::int64_t* tokens, const nn::TokenLayout& layout, const std::int64_t* labels = nullptr,
                       const nn::LossOptions& opt = {}) {
    return run_step(tokens, labels, layout, opt, Mode::loss, nullptr);
  }
  nn::LossMetrics loss_and_grads(const std::int64_t* tokens, const nn::TokenLayout& layout,
                                 const std::int64_t* labels = nullptr, const nn::LossOptions& opt = {}) {
    ensure_grads();
    return run_step(tokens, labels, layout, opt, Mode::train, nullptr);
  }

  /// A device's final hidden states (the last norm's output), as a head other than the
  /// language model's sees them (run_with_head). The device holds batch rows
  /// [batch_first, batch_first + batch_rows), and of each the positions
  /// [seq_first, seq_first + seq_rows) of `seq`; local row t = b * seq_rows + s.
  struct HeadRows {
    Device& dev;
    const float* hidden;  // [batch_rows * seq_rows, hidden_size]
    std::int64_t hidden_size, batch_first, batch_rows, seq_first, seq_rows, seq;
    bool tp_leader;  // tp rank 0 (the ranks of a tp group hold the same rows)
    const std::vector<std::string>& data_axes;  // the axes that split the tokens (size > 1)
    /// Sums over the devices that hold other tokens (every device must call it, in step).
    template <class V>
    void sum_over_data(std::span<V> v) const {
      if (!data_axes.empty()) psum(dev, v, AxisList(data_axes));
    }
  };
  /// A head: the device's metrics from its rows; with `dhidden` (training) it also writes
  /// d loss / d hidden [rows, hidden_size] (zero where the head reads nothing).
  using Head = std::function<nn::LossMetrics(const HeadRows&, float* dhidden)>;

  /// The model through its final norm, then `head` on every device in place of the language
  /// model's; with `train`, the backward from the head's d loss / d hidden, ACCUMULATING the
  /// sharded gradients. Returns what the head returned on this process's lowest device. The
  /// head's own parameters are the caller's (ShardedLlamaForSequenceClassification).
  nn::LossMetrics run_with_head(const std::int64_t* tokens, const nn::TokenLayout& layout, const Head& head,
                                bool train) {
    if (train) ensure_grads();
    return run_step(tokens, nullptr, layout, nn::LossOptions{}, train ? Mode::train : Mode::loss, nullptr, &head);
  }

  /// The one-device model with the gathered parameters (bit-exact).
  LlamaForCausalLM<Pol> gather_model() const {
    LlamaForCausalLM<Pol> m(cfg_);
    if (lora_) lora::apply_lora(m, *lora_, "ShardedLlama");  // the same adapters, values below
    m.visit_params("", [&](std::string_view path, auto& p) {
      const xt::xarray<T> full = gather(params_.at(std::string(path)));
      std::memcpy(p.data(), full.data(), full.size() * sizeof(T));
    });
    return m;
  }

 private:
  enum class Mode { logits, loss, train };

  using Plan = ShardedParamPlan;

  using LayerSaved = typename nn::DecoderLayer<Pol>::Saved;

  struct SnapshotTag {};
  ShardedLlama(const ShardedLlama& o, SnapshotTag)
      : cfg_(o.cfg_), local_cfg_(o.local_cfg_), mesh_(o.mesh_), rules_(o.rules_), tied_(o.tied_), drop_(o.drop_),
        names_(o.names_), trainable_(o.trainable_), lora_(o.lora_), dropout_key_(o.dropout_key_),
        jitter_key_(o.jitter_key_), adapters_active_(o.adapters_active_), plans_(o.plans_), params_(o.params_),
        locals_(o.locals_.size()), data_axes_(o.data_axes_) {}

  // Per-device view of one step.
  ShardedLlama(const LlamaConfig& cfg, std::optional<Key> key, DefaultMesh mesh, PartitionRules rules)
      : cfg_(cfg), mesh_(std::move(mesh)), rules_(std::move(rules)), tied_(cfg.tie_word_embeddings) {
    EDL_CHECK(!Pol::quant_t::quantized, errc::unsupported, "ShardedLlama",
              "the policy quantizes its weights: a model on a mesh holds float weights; quantized models and QLoRA "
              "run on one device");
    setup({});
    // The model's parameters in visit order with their Init kinds; its values are never
    // written, so their pages are never touched.
    LlamaForCausalLM<Pol> shapes(cfg_);
    const float std = static_cast<float>(cfg_.initializer_range);
    std::uint32_t index = 0;
    shapes.visit_params("", [&](std::string_view path, auto& p) {
      const Key k = key ? fold_in(*key, index++) : Key{};
      const nn::Init how = key ? p.init : nn::Init::zeros;
      params_.emplace(std::string(path), sharded_from_index<T>(plans_.at(std::string(path)).layout, mesh_.context(),
                                                               [&](std::uint64_t first, std::span<float> out) {
                                                                 nn::fill_init(how, k, first, out, std);
                                                               }));
    });
  }

  struct Ctx {
    Device* dev = nullptr;
    std::int64_t Bl = 0, S = 0, Sl = 0, H = 0, tp = 1, sp = 1, sp_rank = 0;
    std::int64_t b0 = 0, s0 = 0;  // the device's first batch row and first sequence position
    nn::TokenLayout full;  // the local batch rows over the whole sequence (attention)
    nn::ExpertDispatch<Pol>* experts = nullptr;  // where a MoE layer's experts run (null: here, all held)
    std::int64_t tokens() const noexcept { return Bl * Sl; }
    /// Where the device's tokens (Bl rows of Sl positions) sit in the [B, S] batch: row(t) is
    /// local token t's index there.
    nn::DropoutIndex local_tokens() const noexcept { return nn::DropoutIndex{Sl, S, b0, s0}; }
  };

  const std::string& checked(const std::string& name) const {
    EDL_CHECK(plans_.count(name) > 0, errc::invalid_argument, "ShardedLlama", "no parameter named \"", name, "\"");
    return name;
  }

  std::int64_t axis(const char* a) const { return mesh_.axis_size(a); }

  /// f(name, param) over the LoRA A / B weights of one-device model `m`'s adapted Linears.
  template <class F>
  static void visit_adapter_params(LlamaForCausalLM<Pol>& m, F&& f) {
    m.visit_linears("", [&](const std::string& path, auto& lin) {
      if (!lin.lora) return;
      lin.lora->visit_params(path, [&](std::string_view name, auto& p) { f(std::string(name), p); });
    });
  }

  void setup(const AdapterRanks& adapters) {
    cfg_.validate();
    local_cfg_ = tp_local_config(cfg_, axis("tp"));
    for (auto& [name, p] : sharded_param_plans(cfg_, mesh_.shape(), rules_, tied_, adapters)) {
      names_.push_back(name);
      if (!p.frozen) trainable_.push_back(name);
      plans_.emplace(name, std::move(p));
    }
    for (const auto& a : sharded_detail::data_axes())
      if (mesh_.shape().axis_size(a) > 1) data_axes_.push_back(a);
    locals_.resize(static_cast<std::size_t>(mesh_.size()));
  }

  void ensure_grads() {
    if (!grads_.empty()) return;
    for (const auto& n : trainable_) grads_.emplace(n, zeros_sharded<float>(plans_.at(n).layout, mesh_.context()));
  }

  Local& local_model(std::int64_t d) {
    auto& slot = locals_[static_cast<std::size_t>(d)];
    if (!slot) {
      slot = std::make_unique<Local>(local_cfg_);
      if (lora_) lora::apply_lora(*slot, *lora_, "ShardedLlama");  // the device's block of each adapter
      slot->visit_params("", [](std::string_view, auto& p) { sharded_detail::free_tensor(p.value); });
    }
    return *slot;
  }

  // ------------------------------------------------------------------ parameters (ZeRO-3)
  /// Fills p (the local model's parameter) from the device's blocks.
  template <class Prm>
  void gather_param_into(Device& dev, const std::string& name, Prm& p) {
    const Plan& pl = plans_.at(name);
    const std::int64_t d = dev.id();
    if (!pl.layout.holds(d)) return;  // another ep rank's expert: the local model leaves it empty
    const auto& blk = params_.at(name).local(d);
    const auto& cshape = pl.compute.block_shape();
    p.value = ::edl::detail::make_local<std::remove_cvref_t<decltype(p.value)>>(cshape);
    dev.memory().allocate(d, static_cast<std::int64_t>(p.value.size() * sizeof(T)));
    const std::size_t n = blk.size();
    if (pl.gather_axes.empty()) {
      std::memcpy(p.value.data(), blk.data(), n * sizeof(T));
    } else {
      const auto group = mesh_.shape().group(d, std::span<const std::string>(pl.gather_axes));
      if (blocks_are_row_slabs(pl, group.devices, d)) {  // the gathered buffer is the tensor itself
        all_gather(dev, std::span<const T>(blk.data(), n), std::span<T>(p.value.data(), p.value.size()),
                   AxisList(pl.gather_axes));
      } else {  // each block padded to the largest (uneven dimensions), unpacked to its place
        const std::size_t m = static_cast<std::size_t>(pl.layout.block_elements());
        std::vector<T> part, buf(m * group.devices.size());
        std::span<const T> send(blk.data(), n);
        if (n != m) {
          part.resize(m);
          ::edl::detail::pad_to_block<T>(send, part);
          send = part;
        }
        all_gather(dev, send, buf, AxisList(pl.gather_axes));
        const auto origin = pl.compute.offset(d);
        for (std::size_t k = 0; k < group.devices.size(); ++k)
          ::edl::detail::copy_block<T>(p.value.data(), cshape, sharded_detail::minus(pl.layout.offset(group.devices[k]), origin),
                                       pl.layout.local_shape(group.devices[k]), buf.data() + k * m, false);
      }
    }
    if (pl.row_bias && dev.axis_index("tp") != 0) p.value.fill(T{});
  }

  template <class Prm>
  void release_param(Device& dev, Prm& p) {
    dev.memory().release(dev.id(), static_cast<std::int64_t>(p.value.size() * sizeof(T)));
    sharded_detail::free_tensor(p.value);
  }

  /// Allocates (zeroed) the local gradient before a backward.
  template <class Prm>
  void open_grad(Device& dev, Prm& p) {
    if (p.frozen || p.value.size() == 0) return;  // frozen, or another ep rank's expert
    p.grad_data();
    dev.memory().allocate(dev.id(), static_cast<std::int64_t>(p.grad.size() * sizeof(float)));
  }

  /// Reduces the local (tp-local, partial over the data) gradient into the device's block.
  template <class Prm>
  void reduce_grad(Device& dev, const std::string& name, Prm& p) {
    if (p.frozen) return;
    const Plan& pl = plans_.at(name);
    const std::int64_t d = dev.id();
    if (!pl.layout.holds(d)) return;
    const auto& cshape = pl.compute.block_shape();
    // m: the largest block, the unit of the collectives (each part padded with zeros to it);
    // the device's own block (its first `mine` elements of `out`) may be shorter.
    const std::size_t m = static_cast<std::size_t>(pl.layout.block_elements());
    const std::size_t mine = static_cast<std::size_t>(pl.layout.local_elements(d));
    const auto origin = pl.compute.offset(d);
    std::vector<float> out(m);
    if (pl.scatter_axes.empty()) {
      ::edl::detail::copy_block<float>(p.grad.data(), cshape, sharded_detail::minus(pl.layout.offset(d), origin),
                                       pl.layout.local_shape(d), out.data(), true);
    } else {
      const auto group = mesh_.shape().group(d, std::span<const std::string>(pl.scatter_axes));
      if (blocks_are_row_slabs(pl, group.devices, d)) {  // the gradient is already the packed buffer
        reduce_scatter(dev, std::span<const float>(p.grad.data(), m * group.devices.size()), out,
                       AxisList(pl.scatter_axes));
      } else {
        std::vector<float> packed(m * group.devices.size());  // zeros past each shorter block
        for (std::size_t k = 0; k < group.devices.size(); ++k)
          ::edl::detail::copy_block<float>(p.grad.data(), cshape, sharded_detail::minus(pl.layout.offset(group.devices[k]), origin),
                                           pl.layout.local_shape(group.devices[k]), packed.data() + k * m, true);
        reduce_scatter(dev, packed, out, AxisList(pl.scatter_axes));
      }
    }
    if (!pl.sum_axes.empty()) psum(dev, out, AxisList(pl.sum_axes));
    float* g = grads_.at(name).local(d).data();
    for (std::size_t i = 0; i < mine; ++i) g[i] += out[i];
    dev.memory().release(d, static_cast<std::int64_t>(p.grad.size() * sizeof(float)));
    sharded_detail::free_tensor(p.grad);
  }

  template <class M>
  void gather_module(Device& dev, M& mod, const std::string& prefix) {
    mod.visit_params(prefix, [&](std::string_view path, auto& p) { gather_param_into(dev, std::string(path), p); });
  }
  template <class M>
  void release_module(Device& dev, M& mod) {
    mod.visit_params("", [&](std::string_view, auto& p) { release_param(dev, p); });
  }
  template <class M>
  void open_module_grads(Device& dev, M& mod) {
    mod.visit_params("", [&](std::string_view, auto& p) { open_grad(dev, p); });
  }
  template <class M>
  void reduce_module(Device& dev, M& mod, const std::string& prefix) {
    mod.visit_params(prefix, [&](std::string_view path, auto& p) { reduce_grad(dev, std::string(path), p); });
  }

  // ------------------------------------------------------------------ one decoder layer
  /// What a decoder layer runs between its modules on a device of the mesh (nn::LocalLayer's
  /// calls; nn::DecoderLayer's forward, backward and remat are the one device's code): the
  /// attention runs over the whole sequence of the device's batch rows, so its input is
  /// gathered over sp and its output's rows taken back; the row-parallel outputs (o_proj,
  /// down_proj) and the gradients of the column-parallel inputs are summed over tp; a mixture of
  /// experts dispatches over ep.
  struct MeshLayer {
    const Ctx& c;

    std::int64_t tokens(const nn::TokenLayout&) const noexcept { return c.tokens(); }
    const float* attention_input(const std::vector<float>& n1, std::vector<float>& gathered) const {
      if (c.sp == 1) return n1.data();
      gathered = gather_seq(n1.data());
      return gathered.data();
    }
    template <class Run>
    void attention_output(float* out, std::size_t n, Run&& run) const {
      std::vector<float> full(static_cast<std::size_t>(c.Bl * c.S * c.H));
      run(full.data());
      std::vector<float> mine = c.sp > 1 ? slice_seq(full.data()) : std::move(full);
      if (c.tp > 1) psum(*c.dev, mine, "tp");
      std::memcpy(out, mine.data(), n * sizeof(float));
    }
    template <class Run>
    void attention_backward(const float* dout, float* dn1, std::size_t n, Run&& run) const {
      std::vector<float> padded;
      if (c.sp > 1) padded = pad_seq(dout);
      std::vector<float> dfull(static_cast<std::size_t>(c.Bl * c.S * c.H));
      run(c.sp > 1 ? padded.data() : dout, dfull.data());
      std::vector<float> mine = c.sp > 1 ? scatter_seq(dfull.data()) : std::move(dfull);
      if (c.tp > 1) psum(*c.dev, mine, "tp");
      std::memcpy(dn1, mine.data(), n * sizeof(float));
    }
    void sum_row_parallel(float* y, std::size_t n) const {
      if (c.tp > 1) psum(*c.dev, std::span<float>(y, n), "tp");
    }
    nn::ExpertDispatch<Pol>* experts() const noexcept { return c.experts; }

   private:
    std::size_t row_bytes() const noexcept { return static_cast<std::size_t>(c.Sl * c.H) * sizeof(float); }
    std::size_t at(std::int64_t b, std::int64_t pos) const noexcept { return static_cast<std::size_t>((b * c.S + pos) * c.H); }
    /// local [Bl, Sl, H] -> full [Bl, S, H] (all_gather over sp).
    std::vector<float> gather_seq(const float* local) const {
      const std::size_t blk = static_cast<std::size_t>(c.Bl * c.Sl * c.H);
      std::vector<float> buf(blk * static_cast<std::size_t>(c.sp)), full(buf.size());
      all_gather(*c.dev, std::span<const float>(local, blk), buf, "sp");
      for (std::int64_t r = 0; r < c.sp; ++r)
        for (std::int64_t b = 0; b < c.Bl; ++b)
          std::memcpy(full.data() + at(b, r * c.Sl), buf.data() + static_cast<std::size_t>((r * c.Bl + b) * c.Sl * c.H),
                      row_bytes());
      return full;
    }
    /// full [Bl, S, H] -> this rank's slice [Bl, Sl, H].
    std::vector<float> slice_seq(const float* full) const {
      std::vector<float> l(static_cast<std::size_t>(c.Bl * c.Sl * c.H));
      for (std::int64_t b = 0; b < c.Bl; ++b)
        std::memcpy(l.data() + static_cast<std::size_t>(b * c.Sl * c.H), full + at(b, c.sp_rank * c.Sl), row_bytes());
      return l;
    }
    /// The inverse of slice_seq, zeros elsewhere.
    std::vector<float> pad_seq(const float* local) const {
      std::vector<float> f(static_cast<std::size_t>(c.Bl * c.S * c.H), 0.0f);
      for (std::int64_t b = 0; b < c.Bl; ++b)
        std::memcpy(f.data() + at(b, c.sp_rank * c.Sl), local + static_cast<std::size_t>(b * c.Sl * c.H), row_bytes());
      return f;
    }
    /// full [Bl, S, H] partial sums -> this rank's slice of the sum over sp (reduce_scatter).
    std::vector<float> scatter_seq(const float* full) const {
      const std::size_t blk = static_cast<std::size_t>(c.Bl * c.Sl * c.H);
      std::vector<float> packed(blk * static_cast<std::size_t>(c.sp)), out(blk);
      for (std::int64_t r = 0; r < c.sp; ++r)
        for (std::int64_t b = 0; b < c.Bl; ++b)
          std::memcpy(packed.data() + static_cast<std::size_t>((r * c.Bl + b) * c.Sl * c.H), full + at(b, r * c.Sl),
                      row_bytes());
      reduce_scatter(*c.dev, packed, out, "sp");
      return out;
    }
  };

  // ------------------------------------------------------------------ the step
  nn::LossMetrics run_step(const std::int64_t* tokens, const std::int64_t* labels, const nn::TokenLayout& lay,
                           const nn::LossOptions& opt, Mode mode, float* logits_out, const Head* head = nullptr) {
    const char* w = "ShardedLlama";
    const std::int64_t B = lay.batch, S = lay.seq, H = cfg_.hidden_size;
    check_data_split(B, S, axis("dp"), axis("fsdp"), axis("ep"), axis("sp"), w);
    EDL_CHECK(tokens != nullptr || lay.inputs_embeds != nullptr, errc::invalid_argument, w,
              "needs token ids or inputs_embeds");
    EDL_CHECK(mode == Mode::logits || head || tokens != nullptr || labels != nullptr, errc::invalid_argument, w,
              "inputs_embeds without token ids need labels");
    if (tokens)
      for (std::int64_t i = 0; i < B * S; ++i)
        EDL_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, errc::invalid_argument, w, "token id tokens[", i,
                  "] = ", tokens[i], ", expected in [0, ", cfg_.vocab_size, ")");
    // Global HF shift: targets[b, s] = labels[b, s + 1].
    std::vector<std::int64_t> targets;
    if (mode != Mode::logits && !head) {
      targets = opt.shift ? nn::shift_labels(labels ? labels : tokens, B, S, opt.ignore_index)
                          : std::vector<std::int64_t>(labels ? labels : tokens, (labels ? labels : tokens) + B * S);
    }
    // The metrics are psummed, so every device holds them; keep the lowest local device's
    // (device 0 may run in another process).
    nn::LossMetrics result;
    std::mutex mu;
    std::int64_t from = -1;
    CollectiveBackend& be = mesh_.backend();
    const bool multi = be.processes() > 1;
    if (multi && mode == Mode::logits)  // each process writes its devices' rows, then the sum completes them
      std::fill(logits_out, logits_out + B * S * cfg_.vocab_size, 0.0f);
    if (opt.row_nll) std::fill(opt.row_nll, opt.row_nll + B * S, 0.0);  // likewise: each position from one device
    // d loss / d inputs_embeds: each position's row from one device, summed over the
    // processes, then added to the caller's.
    std::vector<float> embeds_grad(mode == Mode::train && lay.inputs_embeds && lay.inputs_embeds_grad
                                       ? static_cast<std::size_t>(B * S * H)
                                       : 0);
    mesh_.run([&](Device& dev) {
      nn::LossMetrics m = device_step(dev, tokens, targets, lay, opt, mode, logits_out,
                                      embeds_grad.empty() ? nullptr : embeds_grad.data(), head);
      std::lock_guard<std::mutex> lock(mu);
      if (from < 0 || dev.id() < from) {
        result = m;
        from = dev.id();
      }
    });
    if (multi && mode == Mode::logits)
      be.sum_over_processes(logits_out, static_cast<std::size_t>(B * S * cfg_.vocab_size), DType::f32);
    if (multi && opt.row_nll && mode != Mode::logits)
      be.sum_over_processes(opt.row_nll, static_cast<std::size_t>(B * S), DType::f64);
    if (!embeds_grad.empty()) {
      if (multi) be.sum_over_processes(embeds_grad.data(), embeds_grad.size(), DType::f32);
      kernels::add_inplace(lay.inputs_embeds_grad, embeds_grad.data(), static_cast<std::ptrdiff_t>(embeds_grad.size()));
    }
    return result;
  }

  nn::LossMetrics device_step(Device& dev, const std::int64_t* tokens, const std::vector<std::int64_t>& targets,
                              const nn::TokenLayout& lay, const nn::LossOptions& opt, Mode mode, float* logits_out,
                              float* embeds_grad, const Head* head) {
    const std::int64_t B = lay.batch, S = lay.seq;
    const std::int64_t *mask = lay.attention_mask, *pos = lay.position_ids, *seg = lay.segment_ids;
    const float* embeds = lay.inputs_embeds;
    Local& lm = local_model(dev.id());
    auto& model = lm.model;
    Ctx c;
    c.dev = &dev;
    c.tp = dev.axis_size("tp");
    c.sp = dev.axis_size("sp");
    c.sp_rank = dev.axis_index("sp");
    const std::int64_t fsdp = dev.axis_size("fsdp"), ep = dev.axis_size("ep");
    c.Bl = B / (dev.axis_size("dp") * fsdp * ep);
    c.S = S;
    c.Sl = S / c.sp;
    c.H = cfg_.hidden_size;
    // The device's batch rows: data groups are numbered row-major over (dp, fsdp, ep).
    const std::int64_t group = (dev.axis_index("dp") * fsdp + dev.axis_index("fsdp")) * ep + dev.axis_index("ep");
    const std::int64_t b0 = group * c.Bl, s0 = c.sp_rank * c.Sl;
    c.b0 = b0;
    c.s0 = s0;
    std::optional<nn::ExpertParallel<Pol>> experts;
    if (cfg_.is_moe() && ep > 1) {
      experts.emplace(dev, "ep");
      c.experts = &*experts;
    }
    const std::int64_t Tl = c.tokens(), H = c.H, V = cfg_.vocab_size;
    // Attention runs on the local batch rows over the whole sequence: their mask, positions
    // and documents.
    const auto rows_of = [&](const std::int64_t* v) {
      return v ? std::vector<std::int64_t>(v + b0 * S, v + (b0 + c.Bl) * S) : std::vector<std::int64_t>();
    };
    const std::vector<std::int64_t> mask_l = rows_of(mask), pos_l = rows_of(pos), seg_l = rows_of(seg);
    if (lora_) place_adapters(lm, c, b0, s0);
    if (cfg_.is_moe()) place_router_jitter(lm, c);
    c.full = nn::TokenLayout{c.Bl, S, pos ? pos_l.data() : nullptr, mask ? mask_l.data() : nullptr,
                             seg ? seg_l.data() : nullptr};
    // The whole batch's length for rope scalings that depend on it, as one device sees it.
    c.full.context = nn::RotaryEmbedding::context_of(nn::TokenLayout{B, S, pos});
    const std::size_t n = static_cast<std::size_t>(Tl * H);
    const MeshLayer between{c};  // what the layers run between their modules here

    // Local token t (row b * Sl + s) is the batch's token local.row(t) = (b0 + b) * S + s0 + s.
    const nn::DropoutIndex local = c.local_tokens();
    const auto global_row = [&](std::int64_t t) { return local.row(t) * H; };
    std::vector<std::int64_t> ids(tokens ? static_cast<std::size_t>(Tl) : 0), tg;
    if (tokens)
      for (std::int64_t t = 0; t < Tl; ++t) ids[static_cast<std::size_t>(t)] = tokens[local.row(t)];
    if (mode != Mode::logits && !head) {
      tg.resize(static_cast<std::size_t>(Tl));
      for (std::int64_t t = 0; t < Tl; ++t) tg[static_cast<std::size_t>(t)] = targets[local.row(t)];
    }

    // Globals: embedding, final norm, lm_head (replicated compute, kept for the whole step).
    // Another head leaves lm_head alone.
    const bool lm_head = !tied_ && !head;
    gather_module(dev, model.embed_tokens, "model.embed_tokens");
    gather_module(dev, model.norm, "model.norm");
    if (lm_head) gather_module(dev, lm.lm_head, "lm_head");

    const std::size_t L = model.layers.size();
    std::vector<std::vector<float>> xs(L + 1, std::vector<float>(n));
    std::vector<LayerSaved> saved(L);
    typename nn::Embedding<Pol>::Saved embed_s;
    if (embeds)  // the caller's vectors in place of the ids' embeddings
      for (std::int64_t t = 0; t < Tl; ++t)
        std::memcpy(xs[0].data() + t * H, embeds + global_row(t), static_cast<std::size_t>(H) * sizeof(float));
    else
      model.embed_tokens.forward(ids.data(), Tl, xs[0].data(), embed_s);
    const float escale = model.embed_scale();  // Gemma: sqrt(hidden)
    if (escale != 1.0f) kernels::scale(xs[0].data(), escale, static_cast<std::ptrdiff_t>(n));
    nn::round_activations<Pol>(xs[0]);
    // A layer's activations are kept for its backward, unless the step has none or remat drops
    // them all: then only its input (xs) is, and the backward runs the layer again first. A
    // finer mask frees what it names once the layer has run.
    const bool rerun = drop_ == remat::dropped_by<remat::nothing_saveable>();
    const bool keep = mode == Mode::train && !rerun;
    // The sparse layers' routing, kept for the router losses (which need every layer's).
    std::vector<typename nn::MoE<Pol>::Saved> routes(L);
    for (std::size_t l = 0; l < L; ++l) {
      const std::string pre = "model.layers." + std::to_string(l);
      gather_module(dev, model.layers[l], pre);
      model.layers[l].forward(xs[l].data(), c.full, xs[l + 1].data(), saved[l], keep ? drop_ : 0, between);
      if (model.layers[l].is_sparse() && mode != Mode::logits) {
        const auto& m = saved[l].moe_s;
        auto& r = routes[l];
        r.tokens = m.tokens;
        r.logits = m.logits;
        r.probs = m.probs;
        r.top = m.top;
        r.weight = m.weight;
      }
      if (!keep) saved[l] = LayerSaved{};
      release_module(dev, model.layers[l]);
    }
    std::vector<float> hidden(n);
    typename nn::RMSNorm<Pol>::Saved norm_s;
    model.norm.forward(xs[L].data(), Tl, hidden.data(), norm_s);

    nn::LossMetrics metrics;
    if (mode == Mode::logits) {
      std::vector<float> lg(static_cast<std::size_t>(Tl * V));
      lm.apply_lm_head(hidden.data(), Tl, lg.data());
      if (dev.axis_index("tp") == 0)  // every tp rank holds the same logits
        for (std::int64_t b = 0; b < c.Bl; ++b)
          std::memcpy(logits_out + ((b0 + b) * S + s0) * V, lg.data() + b * c.Sl * V,
                      static_cast<std::size_t>(c.Sl * V) * sizeof(float));
    } else {
      const bool train = mode == Mode::train;
      std::vector<float> dhidden(train ? n : 0);
      if (train) {
        open_module_grads(dev, model.embed_tokens);
        open_module_grads(dev, model.norm);
        if (lm_head) open_module_grads(dev, lm.lm_head);
      }
      if (head)
        metrics = (*head)(HeadRows{dev, hidden.data(), H, b0, c.Bl, s0, c.Sl, S, dev.axis_index("tp") == 0,
                                   data_axes_present()},
                          train ? dhidden.data() : nullptr);
      else
        metrics = lm_loss(dev, lm, c, hidden.data(), tg, routes, lay, opt, train ? dhidden.data() : nullptr);

      if (train) {
        std::vector<float> a(n), b(n);
        model.norm.backward(dhidden.data(), norm_s, a.data());
        for (std::size_t l = L; l-- > 0;) {
          const std::string pre = "model.layers." + std::to_string(l);
          gather_module(dev, model.layers[l], pre);
          open_module_grads(dev, model.layers[l]);
          if (rerun) {  // the same kernels and collectives again: bitwise the activations forward had
            std::vector<float> again(n);
            model.layers[l].forward(xs[l].data(), c.full, again.data(), saved[l], 0, between);
          }
          if (model.layers[l].is_sparse())  // the router losses' gradient, added to the router's
            saved[l].moe_s.dlogits_extra = std::move(routes[l].dlogits_extra);
          model.layers[l].backward(a.data(), saved[l], b.data(), between);  // recomputes what remat dropped
          saved[l] = LayerSaved{};
          reduce_module(dev, model.layers[l], pre);
          release_module(dev, model.layers[l]);
          std::swap(a, b);
        }
        if (escale != 1.0f) kernels::scale(a.data(), escale, static_cast<std::ptrdiff_t>(n));
        if (!embeds) model.embed_tokens.backward(a.data(), embed_s);
        else if (embeds_grad && dev.axis_index("tp") == 0)  // tp ranks hold the same rows
          for (std::int64_t t = 0; t < Tl; ++t)
            std::memcpy(embeds_grad + global_row(t), a.data() + t * H, static_cast<std::size_t>(H) * sizeof(float));
        reduce_module(dev, model.embed_tokens, "model.embed_tokens");
        reduce_module(dev, model.norm, "model.norm");
        if (lm_head) reduce_module(dev, lm.lm_head, "lm_head");
      }
    }
    release_module(dev, model.embed_tokens);
    release_module(dev, model.norm);
    if (lm_head) release_module(dev, lm.lm_head);
    return metrics;
  }

  /// The language model's loss over a device's tokens (targets `tg`), its metrics summed over
  /// the data axes; with dhidden, d loss / d hidden and lm_head's gradient.
  nn::LossMetrics lm_loss(Device& dev, Local& lm, const Ctx& c, const float* hidden, const std::vector<std::int64_t>& tg,
                          std::vector<typename nn::MoE<Pol>::Saved>& routes, const nn::TokenLayout& lay,
                          const nn::LossOptions& opt, float* dhidden) {
    const bool train = dhidden != nullptr;
    const std::int64_t Tl = c.tokens(), H = c.H, V = cfg_.vocab_size;
    const std::size_t L = lm.model.layers.size();
    const std::int64_t* mask = lay.attention_mask;
    const nn::DropoutIndex local = c.local_tokens();
    const auto& D = data_axes_present();
    std::int64_t valid = 0;
    nn::LossMetrics metrics;
    for (auto t : tg) valid += t != opt.ignore_index;
    const std::int64_t N = D.empty() ? valid : psum(dev, valid, AxisList(D));
    nn::LossOptions o = lm.loss_options(opt);
    o.shift = false;
    if (o.normalizer <= 0) o.normalizer = static_cast<double>(N);
    // Per-position weights and NLLs ([B, S], global) for the local tokens.
    std::vector<float> w_l(opt.row_weights ? Tl : 0);
    std::vector<double> nll_l(opt.row_nll ? Tl : 0);
    for (std::int64_t t = 0; t < static_cast<std::int64_t>(w_l.size()); ++t)
      w_l[static_cast<std::size_t>(t)] = opt.row_weights[local.row(t)];
    o.row_weights = opt.row_weights ? w_l.data() : nullptr;
    o.row_nll = opt.row_nll ? nll_l.data() : nullptr;
    const nn::LossMetrics lm_m =
        nn::causal_lm_loss(hidden, 1, Tl, H, lm.head_weight(), V, tg.data(), o, dhidden, train ? lm.head_grad() : nullptr);
    if (opt.row_nll && dev.axis_index("tp") == 0)  // tp ranks hold the same values
      for (std::int64_t t = 0; t < Tl; ++t) opt.row_nll[local.row(t)] = nll_l[static_cast<std::size_t>(t)];
    // Combine the metrics: sums over the data axes (tp ranks hold identical values).
    double vals[5] = {lm_m.loss, lm_m.z_loss, lm_m.accuracy * static_cast<double>(valid),
                      valid > 0 ? std::log(lm_m.perplexity) * static_cast<double>(valid) : 0.0, 0.0};
    if (!D.empty()) psum(dev, std::span<double>(vals, 5), AxisList(D));
    metrics.loss = vals[0];
    metrics.z_loss = vals[1];
    metrics.tokens = N;
    metrics.accuracy = N > 0 ? vals[2] / static_cast<double>(N) : 0.0;
    metrics.perplexity = N > 0 ? std::exp(vals[3] / static_cast<double>(N)) : 1.0;
    if (N == 0) metrics.loss = metrics.z_loss = 0.0;
    if (cfg_.is_moe()) {  // the router losses over the whole batch's tokens (counts summed over the data axes)
      std::vector<typename nn::MoE<Pol>::Saved*> routed;
      for (std::size_t l = 0; l < L; ++l)
        if (lm.model.layers[l].is_sparse()) routed.push_back(&routes[l]);
      std::vector<std::int64_t> mask_tok;  // the local tokens' attention mask
      if (mask)
        for (std::int64_t t = 0; t < Tl; ++t) mask_tok.push_back(mask[local.row(t)]);
      const auto sum_devices = [&](std::span<double> v) {
        if (!D.empty()) psum(dev, v, AxisList(D));
      };
      Local::add_router_losses(cfg_, routed, mask ? mask_tok.data() : nullptr, opt, metrics, train, sum_devices);
    }
    return metrics;
  }

  const std::vector<std::string>& data_axes_present() const { return data_axes_; }

  /// Gives the device's adapters this step's dropout key and switch, and places their rows and
  /// columns in the whole batch: attention's projections see the local batch rows over the
  /// whole sequence, the MLP's the local tokens, and a row-parallel base the rank's block of
  /// input columns.
  void place_adapters(Local& lm, const Ctx& c, std::int64_t b0, std::int64_t s0) {
    lora::set_dropout(lm, dropout_key_);
    lora::set_adapters_active(lm, adapters_active_);
    const std::int64_t tp_rank = c.dev->axis_index("tp");
    lm.visit_linears("", [&](const std::string& path, auto& lin) {
      if (!lin.lora) return;
      using Lin = std::remove_cvref_t<decltype(lin)>;
      const bool attention = path.find(".self_attn.") != std::string::npos;
      nn::DropoutIndex& ix = lin.lora->index;
      ix.row_block = attention ? c.S : c.Sl;
      ix.seq = c.S;
      ix.first_row = b0;
      ix.first_pos = attention ? 0 : s0;
      if constexpr (std::is_same_v<typename Lin::WeightParam::spec, nn::RowParallel>) {
        ix.first_col = tp_rank * lin.in_features();
        ix.cols = c.tp * lin.in_features();
      }
    });
  }

  /// Gives the device's sparse layers this step's jitter key and their tokens' places in the
  /// batch (the block runs on the local tokens: rows of Sl positions from s0).
  void place_router_jitter(Local& lm, const Ctx& c) {
    for (auto& L : lm.model.layers) {
      if (!L.is_sparse()) continue;
      L.block_sparse_moe.jitter_key = jitter_key_;
      L.block_sparse_moe.index = c.local_tokens();
    }
  }

  // snapshot() copies every member below but grads_ and locals_: a new member goes there too.
  LlamaConfig cfg_, local_cfg_;
  DefaultMesh mesh_;
  PartitionRules rules_;
  bool tied_ = false;
  remat::DropMask drop_ = 0;  // set_remat: the activations a training step recomputes in backward
  std::vector<std::string> names_, trainable_;
  std::optional<lora::LoraConfig> lora_;  // the adapters' config (none: no adapters)
  std::optional<Key> dropout_key_;         // set_adapter_dropout
  std::optional<Key> jitter_key_;          // set_router_jitter
  bool adapters_active_ = true;           // set_adapters_active
  std::map<std::string, Plan> plans_;
  std::map<std::string, ShardedArray<T>> params_;
  std::map<std::string, ShardedArray<float>> grads_;
  std::vector<std::unique_ptr<Local>> locals_;
  std::vector<std::string> data_axes_;
};

/// Shards a one-device model over `mesh` (EasyDeL's default Llama rules unless given).
template <class Pol>
ShardedLlama<Pol> shard_model(const LlamaForCausalLM<Pol>& model, const DefaultMesh& mesh,
                              PartitionRules rules = llama_partition_rules()) {
  return ShardedLlama<Pol>(model, mesh, std::move(rules));
}

/// The one-device model with the sharded model's parameters (bit-exact).
template <class Pol>
LlamaForCausalLM<Pol> gather_model(const ShardedLlama<Pol>& sharded) {
  return sharded.gather_model();
}

/// What run_on_mesh computes.
enum class MeshOp {
  logits,          // MeshRun::logits_out [tokens, vocab]
  loss,            // the loss only
  loss_and_grads,  // the loss, and every gradient zeroed then accumulated into the model's Param::grad
};

/// One call of run_on_mesh: the operation and its batch.
struct MeshRun {
  MeshOp op = MeshOp::loss;
  const std::int64_t* ids = nullptr;       // [layout.tokens()]
  nn::TokenLayout layout;                  // batch x seq; masks and position ids on one device only
  const std::int64_t* labels = nullptr;    // null: the ids shifted (causal LM)
  float* logits_out = nullptr;             // MeshOp::logits: [layout.tokens(), vocab]
  nn::LossOptions loss;                    // the loss's options
  /// The gradient-checkpointing policy of loss_and_grads (remat::parse's spellings; "" = the
  /// model's own). On a mesh the step keeps every activation (everything_saveable) or runs
  /// each layer again in its backward (nothing_saveable).
  std::string_view remat;
  const PartitionRules* rules = nullptr;   // null: llama_partition_rules()
};

/// THE entry point that runs a model on a mesh of any shape: a one-device mesh runs the model
/// directly, a larger one shards it by the partition rules (ShardedLlama), runs there and
/// gathers what comes back, so the caller sees the same model either way (results equal one
/// device to f32 rounding). For loss_and_grads the gathered gradients land in the model's
/// Param::grad (frozen parameters, such as a LoRA base, get none).
template <class Pol>
nn::LossMetrics run_on_mesh(LlamaForCausalLM<Pol>& model, const DefaultMesh& mesh, const MeshRun& r) {
  const char* w = "models::run_on_mesh";
  EDL_CHECK((r.ids != nullptr || r.layout.inputs_embeds != nullptr) && r.layout.batch >= 1 && r.layout.seq >= 1,
            errc::invalid_argument, w, "expected ids (or inputs_embeds) for a batch x seq of at least 1 x 1, found ",
            r.ids || r.layout.inputs_embeds ? "" : "neither, ", r.layout.batch, " x ", r.layout.seq);
  EDL_CHECK(r.op != MeshOp::logits || r.logits_out != nullptr, errc::invalid_argument, w,
            "MeshOp::logits needs logits_out");
  const remat::DropMask drop = remat::parse(r.remat, "remat");
  if (mesh.size() == 1) {
    switch (r.op) {
      case MeshOp::logits:
        model.logits(r.ids, r.layout, r.logits_out);
        return {};
      case MeshOp::loss:
        return model.loss(r.ids, r.layout, r.labels, r.loss);
      case MeshOp::loss_and_grads: {
        nn::zero_grad(model);
        if (r.remat.empty()) return model.forward_backward(r.ids, r.layout, r.labels, r.loss);
        return model.forward_backward(r.ids, r.layout, r.labels, r.loss, drop);
      }
    }
  }
  ShardedLlama<Pol> sm(model, mesh, r.rules ? *r.rules : llama_partition_rules());
  sm.set_remat(drop);
  if (r.op == MeshOp::logits) {
    const auto l = sm.logits(r.ids, r.layout);
    std::copy(l.begin(), l.end(), r.logits_out);
    return {};
  }
  const nn::LossMetrics m = sm.loss_and_grads(r.ids, r.layout, r.labels, r.loss);
  if (r.op == MeshOp::loss_and_grads) {
    const auto grads = sm.gather_grads();
    nn::zero_grad(model);
    model.visit_params("", [&](std::string_view path, auto& p) {
      if (p.frozen) return;  // a LoRA base: no gradient
      const auto& g = grads.at(std::string(path));
      std::copy(g.begin(), g.end(), p.grad_data());
    });
  }
  return m;
}

}  // namespace edl::models
