// edl/tensor/partition_spec.hpp
// PartitionSpec, as in JAX: one entry per tensor dimension, each `none` (replicated), one mesh
// axis ("tp") or a tuple of axes (axes("dp", "fsdp"), split over their product, major first).
//
//   using WSpec = P<axes("dp", "fsdp"), none, "tp">;   // PartitionSpec(("dp","fsdp"), None, "tp")
//
// The compile-time form P<...> lives in types (ShardedTensor<float, WSpec>), so a rank that does
// not match the tensor or an axis the mesh lacks is a compile error; SpecValue is the same spec
// as a run-time value, for specs that come from data (partition rules, checkpoints).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/fixed_string.hpp>
#include <edl/mesh/mesh_shape.hpp>

namespace edl {

/// One dimension's entry: the mesh axes it is split over, major first (none: replicated).
struct SpecEntry {
  static constexpr std::size_t max_axes = 4;
  std::array<Name, max_axes> names{};
  std::size_t count = 0;

  constexpr SpecEntry() = default;
  template <std::size_t N>
  constexpr SpecEntry(const char (&s)[N]) : names{Name(s)}, count(N > 1 ? 1 : 0) {}  // NOLINT: "tp" is an entry
  constexpr SpecEntry(Name n) : names{n}, count(n.empty() ? 0 : 1) {}                  // NOLINT

  constexpr bool replicated() const noexcept { return count == 0; }
  constexpr bool uses(const Name& a) const noexcept {
    for (std::size_t i = 0; i < count; ++i)
      if (names[i] == a) return true;
    return false;
  }
  friend constexpr bool operator==(const SpecEntry& a, const SpecEntry& b) {
    if (a.count != b.count) return false;
    for (std::size_t i = 0; i < a.count; ++i)
      if (!(a.names[i] == b.names[i])) return false;
    return true;
  }
};

/// A replicated dimension (JAX's None).
inline constexpr SpecEntry none{};

/// A dimension split over several axes, major first: axes("dp", "fsdp").
template <class... Names>
constexpr SpecEntry axes(const Names&... ns) {
  static_assert(sizeof...(Names) <= SpecEntry::max_axes, "edl::axes: at most 4 mesh axes per dimension");
  SpecEntry e;
  ((e.names[e.count++] = Name(ns)), ...);
  return e;
}

namespace detail {
template <std::size_t R>
constexpr bool spec_axis_reused(const std::array<SpecEntry, R>& es) {
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t a = 0; a < es[i].count; ++a)
      for (std::size_t j = i; j < R; ++j)
        for (std::size_t b = (j == i ? a + 1 : 0); b < es[j].count; ++b)
          if (es[i].names[a] == es[j].names[b]) return true;
  return false;
}
}  // namespace detail

/// The run-time form of a spec: per dimension, the axis names.
struct SpecValue {
  std::vector<std::vector<std::string>> dims;

  SpecValue() = default;
  explicit SpecValue(std::vector<std::vector<std::string>> d) : dims(std::move(d)) {}
  std::size_t rank() const noexcept { return dims.size(); }
  friend bool operator==(const SpecValue&, const SpecValue&) = default;

  /// The mesh axes the spec splits over, in the order they appear, each once (EasyDeL's
  /// get_names_from_partition_spec): P(('dp', 'fsdp'), None, 'tp') -> dp, fsdp, tp.
  std::vector<std::string> axis_names() const {
    std::vector<std::string> names;
    for (const auto& d : dims)
      for (const auto& a : d)
        if (std::find(names.begin(), names.end(), a) == names.end()) names.push_back(a);
    return names;
  }

  /// "P(('dp', 'fsdp'), None, 'tp')", as JAX prints it.
  std::string str() const {
    std::string s = "P(";
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (i) s += ", ";
      const auto& d = dims[i];
      if (d.empty()) s += "None";
      else if (d.size() == 1) s += "'" + d[0] + "'";
      else {
        s += "(";
        for (std::size_t k = 0; k < d.size(); ++k) s += (k ? ", '" : "'") + d[k] + "'";
        s += ")";
      }
    }
    return s + ")";
  }

  /// Number of blocks dimension `dim` is split into on `mesh`.
  std::int64_t splits(std::size_t dim, const MeshShape& mesh) const {
    std::int64_t n = 1;
    for (const auto& a : dims[dim]) n *= mesh.axis_size(a);
    return n;
  }

  /// Checks the spec against a mesh and, if given, a global shape: axes exist, no axis is used
  /// twice and the rank matches. A dimension its axes do not divide is allowed (ShardLayout
  /// cuts it into near-equal blocks); check_divides refuses it where a split must be even.
  /// `where` names the tensor in the error ("model.layers.0.mlp.up_proj.weight").
  void validate(const MeshShape& mesh, std::span<const std::int64_t> shape, std::string_view where) const {
    const std::string w(where);
    std::vector<std::string> seen;
    for (const auto& d : dims)
      for (const auto& a : d) {
        EDL_CHECK(mesh.has_axis(a), errc::unknown_axis, w, "spec ", str(), " names axis \"", a,
                  "\" but the mesh has axes ", mesh.axes_str());
        for (const auto& s : seen)
          EDL_CHECK(s != a, errc::axis_reused, w, "spec ", str(), " uses mesh axis \"", a, "\" twice");
        seen.push_back(a);
      }
    EDL_CHECK(shape.size() == dims.size(), errc::shape_mismatch, w, "spec ", str(), " has ", dims.size(),
              " entries but the tensor has rank ", shape.size(), " (shape ", detail::shape_str(shape), ")");
  }
  /// Refuses a dimension its axes do not divide: for a split that computation relies on (a
  /// tensor-parallel block of heads), where storage alone splits unevenly (ShardLayout).
  void check_divides(const MeshShape& mesh, std::span<const std::int64_t> shape, std::string_view where) const {
    for (std::size_t i = 0; i < dims.size() && i < shape.size(); ++i) {
      const std::int64_t n = splits(i, mesh);
      EDL_CHECK(shape[i] % n == 0, errc::not_divisible, std::string(where), "dimension ", i, " of shape ", detail::shape_str(shape),
                " is ", shape[i], ", not divisible by ", n, " (spec ", str(), " on mesh ", mesh.axes_str(), ")");
    }
  }
};

/// PartitionSpec as a type: P<"tp", none>, P<axes("dp", "fsdp"), none, "tp">.
template <SpecEntry... Entries>
struct P {
  static constexpr std::size_t rank = sizeof...(Entries);
  static constexpr std::array<SpecEntry, rank> entries{Entries...};
  static_assert(!detail::spec_axis_reused<rank>(std::array<SpecEntry, rank>{Entries...}),
                "edl::P: a mesh axis is used by more than one dimension of this PartitionSpec");

  /// Does every axis this spec names exist in a mesh with axes `MeshAxes`?
  template <Name... MeshAxes>
  static constexpr bool fits_axes() {
    for (const auto& e : entries)
      for (std::size_t i = 0; i < e.count; ++i)
        if (!((e.names[i] == MeshAxes) || ...)) return false;
    return true;
  }

  static SpecValue value() {
    SpecValue v;
    for (const auto& e : entries) {
      std::vector<std::string> d;
      for (std::size_t i = 0; i < e.count; ++i) d.emplace_back(e.names[i].view());
      v.dims.push_back(std::move(d));
    }
    return v;
  }
};

template <class T>
struct is_partition_spec : std::false_type {};
template <SpecEntry... E>
struct is_partition_spec<P<E...>> : std::true_type {};
template <class T>
concept PartitionSpecType = is_partition_spec<T>::value;

/// A spec that replicates every one of `R` dimensions.
template <std::size_t R>
struct replicated_spec;
template <>
struct replicated_spec<1> { using type = P<none>; };
template <>
struct replicated_spec<2> { using type = P<none, none>; };
template <>
struct replicated_spec<3> { using type = P<none, none, none>; };
template <>
struct replicated_spec<4> { using type = P<none, none, none, none>; };

}  // namespace edl
