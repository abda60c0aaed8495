// edl/models/llama/transform_rules.hpp: loading rules for checkpoints whose tensor names or
// layouts are not HF's (the seeds' ParameterTransformRule / transform_fn): each rule is a
// regex over the checkpoint's names, its replacement (std::regex_replace syntax, $1 ...) and
// optionally a transform of the tensor's values and shape. The view presents the checkpoint
// under the new names, so every loader takes it:
//
//   models::TransformRules rules{
//       {R"(^transformer\.h\.(\d+)\.attn\.q\.weight$)", "model.layers.$1.self_attn.q_proj.weight"},
//       {R"(^transformer\.wte$)", "model.embed_tokens.weight"},
//       {R"(^transformer\.head$)", "lm_head.weight", models::transpose_2d},  // stored [in, out]
//   };
//   models::load_weights(model, models::TransformedCheckpoint(ckpt, rules));
//   auto m = models::from_pretrained(dir, {.transform_rules = rules});   // the same, from a folder
//
// The first rule whose pattern matches a name (std::regex_search) renames it; names no rule
// matches keep theirs. Two tensors renamed to one name are an error naming both. A transformed
// tensor is read once as f32 when first asked for (its shape is the transform's), then converted
// to the parameter's dtype with one rounding; untransformed tensors are read as they are.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/checkpoint_source.hpp>

namespace edl::models {

/// A tensor's values (f32, row-major) and shape, as a transform receives and returns them.
struct TensorValues {
  std::vector<float> values;
  std::vector<std::int64_t> shape;
};

/// One loading rule: names matching `pattern` become `replacement` (regex_replace); `transform`
/// (optional) changes the tensor (a transpose, a permutation, a scale).
struct TransformRule {
  std::string pattern;
  std::string replacement;
  std::function<void(TensorValues&)> transform;
};
using TransformRules = std::vector<TransformRule>;

/// A common transform: a 2-D tensor [a, b] becomes its transpose [b, a] (weights stored [in, out]).
inline void transpose_2d(TensorValues& t) {
  EDL_CHECK(t.shape.size() == 2, errc::shape_mismatch, "transpose_2d", "expected a 2-D tensor, found shape ",
            ::edl::detail::shape_str(t.shape));
  const std::int64_t a = t.shape[0], b = t.shape[1];
  std::vector<float> out(t.values.size());
  for (std::int64_t i = 0; i < a; ++i)
    for (std::int64_t j = 0; j < b; ++j) out[static_cast<std::size_t>(j * a + i)] = t.values[static_cast<std::size_t>(i * b + j)];
  t.values = std::move(out);
  t.shape = {b, a};
}

/// `ckpt` (io::ShardedCheckpoint, io::SafeTensorsFile, ...) under the names `rules` give.
template <class Ckpt>
class TransformedCheckpoint {
 public:
  TransformedCheckpoint(const Ckpt& ckpt, TransformRules rules)
      : ckpt_(ckpt), rules_(std::move(rules)), cache_(std::make_shared<Cache>()) {
    std::vector<std::regex> compiled;
    for (const auto& r : rules_) {
      try {
        compiled.emplace_back(r.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        ::edl::detail::raise(errc::invalid_argument, "TransformRules",
                             ::edl::detail::concat("pattern \"", r.pattern, "\" is not a valid regex: ", e.what()));
      }
    }
    for (const std::string& n : ckpt.names()) {
      Entry e{n, -1};
      std::string renamed = n;
      for (std::size_t i = 0; i < rules_.size(); ++i)
        if (std::regex_search(n, compiled[i])) {
          renamed = std::regex_replace(n, compiled[i], rules_[i].replacement);
          if (rules_[i].transform) e.transform = static_cast<std::ptrdiff_t>(i);
          break;
        }
      const auto [it, fresh] = entries_.emplace(renamed, e);
      EDL_CHECK(fresh, errc::format, file_of_stored(n) + " tensor " + n, "and tensor ", it->second.stored,
                " are both renamed to \"", renamed, "\" by the loading rules");
      names_.push_back(renamed);
    }
  }

  const std::vector<std::string>& names() const noexcept { return names_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  const io::TensorInfo& info(const std::string& name) const {
    const Entry& e = entry(name);
    if (e.transform < 0) return ckpt_.info(e.stored);
    return transformed(name, e).info;
  }
  std::string file_of(const std::string& name) const { return file_of_stored(entry(name).stored); }
  std::string path() const { return detail::checkpoint_source(ckpt_); }

  /// Tensor `name` converted to T (the transform's result, or the stored tensor).
  template <class T>
  void read_into(const std::string& name, std::span<T> out) const {
    const Entry& e = entry(name);
    if (e.transform < 0) return ckpt_.template read_into<T>(e.stored, out);
    const Transformed& t = transformed(name, e);
    EDL_CHECK(out.size() == t.values.size(), errc::shape_mismatch, file_of(name) + " tensor " + name, "holds ",
              t.values.size(), " values after its transform, the destination ", out.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(t.values[i]);
  }
  /// The stored name a tensor came from.
  const std::string& stored_name(const std::string& name) const { return entry(name).stored; }

 private:
  struct Entry {
    std::string stored;
    std::ptrdiff_t transform;  // index of the rule whose transform applies; -1: none
  };
  struct Transformed {
    io::TensorInfo info;
    std::vector<float> values;
  };
  struct Cache {
    std::mutex mu;
    std::map<std::string, Transformed> done;
  };

  const Entry& entry(const std::string& name) const {
    const auto it = entries_.find(name);
    EDL_CHECK(it != entries_.end(), errc::format, path(), "no tensor \"", name, "\" after the loading rules");
    return it->second;
  }
  std::string file_of_stored(const std::string& stored) const { return detail::file_of(ckpt_, stored); }
  const Transformed& transformed(const std::string& name, const Entry& e) const {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (const auto it = cache_->done.find(name); it != cache_->done.end()) return it->second;
    TensorValues t;
    t.shape = ckpt_.info(e.stored).shape;
    t.values.resize(static_cast<std::size_t>(ckpt_.info(e.stored).numel()));
    ckpt_.template read_into<float>(e.stored, std::span<float>(t.values));
    rules_[static_cast<std::size_t>(e.transform)].transform(t);
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    EDL_CHECK(n == static_cast<std::int64_t>(t.values.size()), errc::shape_mismatch,
              file_of_stored(e.stored) + " tensor " + e.stored, "its transform returned ", t.values.size(),
              " values for shape ", ::edl::detail::shape_str(t.shape));
    Transformed out;
    out.info.dtype = DType::f32;
    out.info.shape = std::move(t.shape);
    out.info.begin = 0;
    out.info.end = static_cast<std::uint64_t>(n) * sizeof(float);
    out.values = std::move(t.values);
    return cache_->done.emplace(name, std::move(out)).first->second;
  }

  const Ckpt& ckpt_;
  TransformRules rules_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> names_;
  std::shared_ptr<Cache> cache_;
};

}  // namespace edl::models
