// edl/nn/module_tree.hpp: a module's parameter tree as text (the seeds' __repr__ and
// get_module_repr), for people reading a model, not for programs:
//
//   std::cout << nn::module_repr(model, "LlamaForCausalLM", &rules);
//
//   LlamaForCausalLM: 1,104 parameters (F32)
//     model: 1,104 parameters
//       embed_tokens: 512 parameters
//         weight (32, 16) F32 P('tp', ('fsdp', 'sp'))
//       layers: 576 parameters
//         0-1: 288 parameters each
//           input_layernorm: 16 parameters
//             weight (16) F32 P(None)
//           ...
//
// The tree comes from the parameters' dotted paths (visit_params), so every module that
// visits its parameters prints, whatever its kind. Numbered children (layers, experts) with
// the same structure and shapes fold into one "first-last" entry; each line of a module gives
// its parameter count, each parameter line its shape, dtype and, with partition rules, the
// spec its path matches.
#pragma once

#include <cctype>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/tensor/partition_rules.hpp>

namespace edl::nn {

namespace module_tree_detail {

struct Node {
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> children;  // visit order
  std::string leaf;            // a parameter: "[shape] dtype spec"; empty for a module
  std::int64_t params = 0;     // in this subtree

  Node& child(const std::string& name) {
    for (auto& [n, c] : children)
      if (n == name) return *c;
    children.emplace_back(name, std::make_unique<Node>());
    return *children.back().second;
  }
};

inline bool is_index(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

inline std::string with_commas(std::int64_t n) {
  std::string d = std::to_string(n), out;
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

// The lines below `n`, each indented by `depth` levels.
inline void print_children(const Node& n, int depth, std::ostringstream& out);

inline std::string body(const Node& n, int depth) {
  std::ostringstream o;
  print_children(n, depth, o);
  return o.str();
}

inline void print_children(const Node& n, int depth, std::ostringstream& out) {
  const std::string pad(static_cast<std::size_t>(2 * depth), ' ');
  bool numbered = !n.children.empty();
  for (const auto& [name, c] : n.children) numbered = numbered && is_index(name);
  for (std::size_t i = 0; i < n.children.size();) {
    const auto& [name, c] = n.children[i];
    if (!c->leaf.empty()) {
      out << pad << name << ' ' << c->leaf << '\n';
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    const std::string b = body(*c, depth + 1);
    if (numbered)  // fold the run of identical numbered children
      while (j < n.children.size() && body(*n.children[j].second, depth + 1) == b) ++j;
    if (j - i > 1) {
      out << pad << name << '-' << n.children[j - 1].first << ": " << with_commas(c->params) << " parameters each\n";
    } else {
      out << pad << name << ": " << with_commas(c->params) << " parameters\n";
    }
    out << b;
    i = j;
  }
}

}  // namespace module_tree_detail

/// The parameter tree of `m` (see the header comment), under the title `name`. With `rules`,
/// each parameter shows the spec its path matches ("no rule" when none does).
template <class M>
std::string module_repr(M& m, std::string_view name, const PartitionRules* rules = nullptr) {
  using module_tree_detail::Node;
  Node root;
  std::string dtypes;
  m.visit_params("", [&](std::string_view path, auto& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    const std::string dt(dtype_name(dtype_v<T>));
    if (dtypes.find(dt) == std::string::npos) dtypes += (dtypes.empty() ? "" : ", ") + dt;
    Node* n = &root;
    std::string part;
    std::vector<Node*> chain{n};
    const std::string full(path);
    for (std::size_t start = 0;;) {
      const std::size_t dot = full.find('.', start);
      part = full.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      n = &n->child(part);
      chain.push_back(n);
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    std::string leaf = ::edl::detail::shape_str(p.shape()) + " " + dt;
    if (rules) {
      const std::ptrdiff_t r = rules->match(full);
      leaf += r < 0 ? std::string(" no rule") : " " + rules->rules()[static_cast<std::size_t>(r)].spec.str();
    }
    n->leaf = std::move(leaf);
    for (Node* c : chain) c->params += p.numel();
  });
  std::ostringstream out;
  out << name << ": " << module_tree_detail::with_commas(root.params) << " parameters (" << dtypes << ")\n";
  module_tree_detail::print_children(root, 1, out);
  return out.str();
}

}  // namespace edl::nn
