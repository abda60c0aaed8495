// edl/tensor/partition_rules.hpp
// EasyDeL's partition_rules: an ordered list of (regex over a parameter path, PartitionSpec);
// the first rule whose regex matches the path (std::regex_search, as re.search) wins.
//
//   PartitionRules rules{{"self_attn/(q|k|v)_proj", P<"tp", "fsdp">::value()}, {".*", SpecValue{}}};
//   SpecValue s = rules.spec_for("model.layers.3.self_attn.q_proj.weight", {2048, 2048}, mesh.shape());
//
// Paths are HF names ("model.layers.3.self_attn.q_proj.weight"); a rule may write its
// separators as '.' or '/' (EasyDeL's style), both match. A spec shorter than the tensor's
// rank replicates the remaining dimensions (JAX's rule); a longer one, an unknown axis or a
// dimension that does not divide is an error naming the path and the rule.
#pragma once

#include <regex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/mesh/mesh_shape.hpp>
#include <edl/tensor/partition_spec.hpp>

namespace edl {

class PartitionRules {
 public:
  struct Rule {
    std::string pattern;
    SpecValue spec;
  };

  PartitionRules() = default;
  PartitionRules(std::initializer_list<Rule> rules) {
    for (const auto& r : rules) add(r.pattern, r.spec);
  }

  /// Appends a rule (lowest priority so far). A malformed regex is an error naming it.
  PartitionRules& add(std::string pattern, SpecValue spec) {
    std::string re;
    for (char c : pattern) re += (c == '/') ? std::string("[./]") : std::string(1, c);
    try {
      compiled_.emplace_back(re, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      detail::raise(errc::invalid_argument, "PartitionRules", detail::concat("rule \"", pattern, "\" is not a valid regex: ", e.what()));
    }
    rules_.push_back({std::move(pattern), std::move(spec)});
    return *this;
  }

  std::size_t size() const noexcept { return rules_.size(); }
  const std::vector<Rule>& rules() const noexcept { return rules_; }

  /// Index of the first rule matching `path`, or -1.
  std::ptrdiff_t match(std::string_view path) const {
    const std::string p(path);
    for (std::size_t i = 0; i < compiled_.size(); ++i)
      if (std::regex_search(p, compiled_[i])) return static_cast<std::ptrdiff_t>(i);
    return -1;
  }

  /// The spec for a parameter: first matching rule, padded with None to the tensor's rank and
  /// validated against `mesh` and `shape`. Errors name the path and the rule.
  SpecValue spec_for(std::string_view path, std::span<const std::int64_t> shape, const MeshShape& mesh) const {
    const auto i = match(path);
    EDL_CHECK(i >= 0, errc::no_matching_rule, std::string(path), "no partition rule matches this parameter (",
              rules_.size(), " rules); add a catch-all rule \".*\" to replicate the rest");
    const Rule& r = rules_[static_cast<std::size_t>(i)];
    EDL_CHECK(r.spec.rank() <= shape.size(), errc::shape_mismatch, std::string(path), "rule \"", r.pattern, "\" gives spec ",
              r.spec.str(), " with ", r.spec.rank(), " entries, but the tensor has rank ", shape.size(), " (shape ",
              detail::shape_str(shape), ")");
    SpecValue s = r.spec;
    s.dims.resize(shape.size());
    try {
      s.validate(mesh, shape, path);
    } catch (const Error& e) {
      detail::raise(e.code(), std::string(path), detail::concat("rule \"", r.pattern, "\" does not fit: ", e.what()));
    }
    return s;
  }
  SpecValue spec_for(std::string_view path, std::initializer_list<std::int64_t> shape, const MeshShape& mesh) const {
    return spec_for(path, std::span<const std::int64_t>(shape.begin(), shape.size()), mesh);
  }

 private:
  std::vector<Rule> rules_;
  std::vector<std::regex> compiled_;
};

/// EasyDeL's default Llama rules (fully sharded data parallel), for HF tensor layouts: linear
/// weights are [out, in], so a column-parallel projection (q/k/v, gate, up) splits dimension 0
/// over tp, a row-parallel one (o, down) splits dimension 1 over tp; the other dimension goes
/// over (fsdp, sp), ZeRO-3 style. Embedding and lm_head split the vocabulary over tp. Biases
/// follow their projection's output: q/k/v and gate/up biases over tp, o/down biases (and norms,
/// Qwen3's per-head q/k norms included, and anything else 1-D) replicated. A mixture-of-experts
/// layer's experts split like the MLP (the router stays replicated).
inline PartitionRules llama_partition_rules() {
  const SpecValue col{{{"tp"}, {"fsdp", "sp"}}};
  const SpecValue row{{{"fsdp", "sp"}, {"tp"}}};
  return PartitionRules{
      {"embed_tokens/weight", col},
      {"self_attn/(q_proj|k_proj|v_proj)/weight", col},
      {"self_attn/(q_proj|k_proj|v_proj)/bias", SpecValue{{{"tp"}}}},
      {"self_attn/o_proj/weight", row},
      {"mlp/(gate_proj|up_proj)/weight", col},
      {"mlp/(gate_proj|up_proj)/bias", SpecValue{{{"tp"}}}},
      {"mlp/down_proj/weight", row},
      // Mixture-of-experts layers: each expert (and a shared expert) is an MLP; the ep axis
      // places whole experts (models::ShardedLlama), these rules split each one further.
      {"experts/\\d+/(w1|w3|gate_proj|up_proj)/weight", col},
      {"experts/\\d+/(w2|down_proj)/weight", row},
      {"shared_expert/(gate_proj|up_proj)/weight", col},
      {"shared_expert/down_proj/weight", row},
      {"(input_layernorm|post_attention_layernorm)/weight", SpecValue{{{}}}},
      {"self_attn/(q_norm|k_norm)/weight", SpecValue{{{}}}},
      {"model/norm/weight", SpecValue{{{}}}},
      {"lm_head/weight", col},
      {"score/weight", SpecValue{{{}, {"fsdp", "sp"}}}},
      {".*", SpecValue{}},
  };
}

}  // namespace edl
