// edl/mesh/mesh_shape.hpp
// The topology of a device mesh: named axes, their sizes, and device coordinates.
//
// Devices are numbered row-major over the axes in mesh order (the last axis varies
// fastest), as jax.sharding.Mesh does with np.arange(n).reshape(sizes). For the default
// axes ("dp", "fsdp", "ep", "tp", "sp") with sizes (2, 1, 1, 2, 1), device 3 sits at (dp=1, tp=1).
//
// A collective over a subset of axes runs within a *group*: the devices whose coordinates
// agree on every axis not named. Group members are ordered row-major over the named axes,
// in mesh order, so "position in group" is what axis_index returns for a single axis.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <edl/core/error.hpp>

namespace edl {

class MeshShape {
 public:
  MeshShape() = default;

  /// names: distinct axis names; sizes: one per name, each > 0 or at most one -1, which is
  /// inferred so that the product equals `devices` (as EasyDeL's create_mesh((1, -1, 1, 1))).
  MeshShape(std::vector<std::string> names, std::vector<std::int64_t> sizes, std::int64_t devices = -1)
      : names_(std::move(names)), sizes_(std::move(sizes)) {
    EDL_CHECK(names_.size() == sizes_.size(), errc::shape_mismatch, "Mesh",
              "expected one size per axis (", names_.size(), " axes), found ", sizes_.size(), " sizes");
    for (std::size_t i = 0; i < names_.size(); ++i)
      for (std::size_t j = i + 1; j < names_.size(); ++j)
        EDL_CHECK(names_[i] != names_[j], errc::axis_reused, "Mesh", "axis \"", names_[i], "\" is named twice");
    std::int64_t known = 1;
    int infer = -1;
    for (std::size_t i = 0; i < sizes_.size(); ++i) {
      if (sizes_[i] == -1) {
        EDL_CHECK(infer < 0, errc::invalid_argument, "Mesh", "at most one axis size may be -1, found two: \"",
                  names_[infer], "\" and \"", names_[i], "\"");
        infer = static_cast<int>(i);
      } else {
        EDL_CHECK(sizes_[i] > 0, errc::invalid_argument, "Mesh", "axis \"", names_[i],
                  "\" must have a positive size or -1, found ", sizes_[i]);
        known *= sizes_[i];
      }
    }
    if (infer >= 0) {
      EDL_CHECK(devices > 0, errc::invalid_argument, "Mesh", "axis \"", names_[infer],
                "\" is -1, so the device count is needed to infer it; none was given");
      EDL_CHECK(devices % known == 0, errc::not_divisible, "Mesh", devices, " devices do not divide over the fixed axes (product ",
                known, ") to infer axis \"", names_[infer], "\"");
      sizes_[infer] = devices / known;
      known = devices;
    } else if (devices > 0) {
      EDL_CHECK(known == devices, errc::shape_mismatch, "Mesh", "axis sizes ", detail::shape_str(sizes_),
                " make ", known, " devices, expected ", devices);
    }
    size_ = known;
  }

  std::size_t rank() const noexcept { return names_.size(); }
  std::int64_t size() const noexcept { return size_; }
  const std::vector<std::string>& names() const noexcept { return names_; }
  const std::vector<std::int64_t>& sizes() const noexcept { return sizes_; }

  bool has_axis(std::string_view name) const noexcept {
    for (const auto& n : names_)
      if (n == name) return true;
    return false;
  }
  /// Index of a named axis; an unknown name is an error naming `where` and the mesh's axes.
  std::size_t axis_index(std::string_view name, std::string_view where = "Mesh") const {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return i;
    detail::raise(errc::unknown_axis, std::string(where),
                  detail::concat("axis \"", name, "\" is not a mesh axis; the mesh has ", axes_str()));
  }
  std::int64_t axis_size(std::string_view name) const { return sizes_[axis_index(name)]; }

  /// Coordinates of device `d` (row-major, last axis fastest).
  std::vector<std::int64_t> coords(std::int64_t d) const {
    std::vector<std::int64_t> c(rank());
    for (std::size_t i = rank(); i-- > 0;) {
      c[i] = d % sizes_[i];
      d /= sizes_[i];
    }
    return c;
  }
  std::int64_t device_id(std::span<const std::int64_t> c) const {
    std::int64_t d = 0;
    for (std::size_t i = 0; i < rank(); ++i) d = d * sizes_[i] + c[i];
    return d;
  }

  /// Members of device d's group over `axes` (in group order) and d's position in it.
  struct Group {
    std::vector<std::int64_t> devices;
    std::int64_t position = 0;
    std::int64_t size() const noexcept { return static_cast<std::int64_t>(devices.size()); }
  };
  Group group(std::int64_t d, std::span<const std::string> axes) const {
    std::vector<bool> in(rank(), false);
    for (const auto& a : axes) {
      const std::size_t i = axis_index(a, "collective");
      EDL_CHECK(!in[i], errc::axis_reused, "collective", "axis \"", a, "\" is named twice");
      in[i] = true;
    }
    const auto mine = coords(d);
    Group g;
    std::int64_t count = 1;
    for (std::size_t i = 0; i < rank(); ++i)
      if (in[i]) count *= sizes_[i];
    g.devices.reserve(static_cast<std::size_t>(count));
    // Enumerate the named axes row-major; the others stay at d's coordinates.
    std::vector<std::int64_t> c = mine;
    for (std::size_t i = 0; i < rank(); ++i)
      if (in[i]) c[i] = 0;
    for (std::int64_t k = 0; k < count; ++k) {
      std::int64_t r = k;
      for (std::size_t i = rank(); i-- > 0;)
        if (in[i]) {
          c[i] = r % sizes_[i];
          r /= sizes_[i];
        }
      const std::int64_t id = device_id(c);
      if (id == d) g.position = k;
      g.devices.push_back(id);
    }
    return g;
  }
  Group group(std::int64_t d, std::initializer_list<std::string> axes) const {
    return group(d, std::span<const std::string>(axes.begin(), axes.size()));
  }

  /// "(dp=1, tp=3)": the device's non-trivial coordinates, for error messages.
  std::string describe(std::int64_t d) const {
    const auto c = coords(d);
    std::string s = "(";
    bool first = true;
    for (std::size_t i = 0; i < rank(); ++i) {
      if (sizes_[i] == 1 && rank() > 1) continue;
      if (!first) s += ", ";
      s += names_[i] + "=" + std::to_string(c[i]);
      first = false;
    }
    return s + ")";
  }
  /// "(dp=2, fsdp=1, tp=4, sp=1)".
  std::string axes_str() const {
    std::string s = "(";
    for (std::size_t i = 0; i < rank(); ++i) s += (i ? ", " : "") + names_[i] + "=" + std::to_string(sizes_[i]);
    return s + ")";
  }

  friend bool operator==(const MeshShape& a, const MeshShape& b) {
    return a.names_ == b.names_ && a.sizes_ == b.sizes_;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::int64_t> sizes_;
  std::int64_t size_ = 1;
};

}  // namespace edl
