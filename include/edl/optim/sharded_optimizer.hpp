// edl/optim/sharded_optimizer.hpp
// The optimizer of a sharded model, ZeRO-style: each device keeps the optimizer state of the
// parameter blocks it holds (fsdp=N: about 1/N of the state per device) and updates those
// blocks with its own gradient blocks. Nothing is gathered to update.
//
//   models::ShardedLlama<> sm(model, mesh);
//   optim::ShardedOptimizer opt({.kind = optim::OptimizerKind::adamw, .weight_decay = 0.1}, sm);
//   sm.zero_grad();
//   sm.loss_and_grads(tokens, labels, batch, seq);
//   const double norm = opt.clip_by_global_norm(sm, 1.0);
//   opt.step(sm, lr);
//
// Equal to the one-device Optimizer: AdamW, SGD and Lion are elementwise, so updating a block
// is updating those elements; a block replicated on several devices (a norm weight under tp)
// gets the same gradient and the same state on each, so its copies stay identical. The
// global gradient norm counts each distinct block once (ShardLayout::block_owners) and sums
// over the mesh with psum in a fixed order, so it is the same on every device and run; it
// differs from the one-device norm only by the order of the f64 sum.
// Adafactor factors its second moment over the rows and columns of the whole matrix, which a
// block does not have: it is refused on a mesh of more than one device.
//
// The model type needs: mesh(), trainable_names() (the parameters with gradients: all, or a
// LoRA model's adapters), param(name) and grad(name) returning ShardedArrays, and has_grads()
// (models::ShardedLlama has them). Device bodies run inside mesh.run, so on a
// multi-process mesh each process updates the blocks of its own devices.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/tensor/sharded_tensor.hpp>

namespace edl::optim {

template <class ShardedModel>
class ShardedOptimizer {
 public:
  ShardedOptimizer(OptimizerOptions o, const ShardedModel& model)
      : opt_(o), devices_(model.mesh().size()), per_device_(static_cast<std::size_t>(devices_), Optimizer(o)) {
    EDL_CHECK(o.kind != OptimizerKind::adafactor || devices_ == 1, errc::unsupported, "ShardedOptimizer",
              "adafactor factors its second moment over whole matrices, which a shard does not hold; on a mesh of ",
              devices_, " devices use adamw, sgd or lion");
    for (const auto& name : model.trainable_names()) {
      std::vector<char> own(static_cast<std::size_t>(devices_), 0);
      for (std::int64_t d : model.param(name).layout().block_owners()) own[static_cast<std::size_t>(d)] = 1;
      owner_.emplace(name, std::move(own));
    }
  }

  const OptimizerOptions& options() const noexcept { return opt_; }
  /// Updates applied so far (the same on every device).
  std::int64_t step_count() const noexcept { return step_count_; }
  void set_step_count(std::int64_t s) noexcept {
    step_count_ = s;
    for (auto& o : per_device_) o.set_step_count(s);
  }
  /// The optimizer of one device (its slots are that device's blocks).
  const Optimizer& device(std::int64_t d) const { return per_device_.at(static_cast<std::size_t>(d)); }
  /// Drops every device's state (step count 0), as before the first step.
  void reset() {
    for (auto& o : per_device_) o = Optimizer(opt_);
    step_count_ = 0;
  }
  /// Sets one slot of device d: the values of its block of parameter `path` (loading a
  /// checkpoint block by block).
  void set_device_slot(std::int64_t d, const std::string& path, const std::string& slot, std::vector<float> v) {
    per_device_.at(static_cast<std::size_t>(d)).set_slot(path, slot, std::move(v));
  }
  /// Optimizer-state bytes device d holds.
  std::int64_t state_bytes(std::int64_t d) const { return device(d).state_bytes(); }

  /// sqrt of the sum of squares of every gradient, each distinct block counted once.
  double global_grad_norm(ShardedModel& m) const {
    EDL_CHECK(m.has_grads(), errc::invalid_argument, "ShardedOptimizer", "no gradients yet: call loss_and_grads first");
    const auto& mesh = m.mesh();
    const AxisList all = all_axes(mesh);
    double result = 0.0;
    std::mutex mu;
    mesh.run([&](Device& dev) {
      const std::int64_t d = dev.id();
      double sq = 0.0;
      for (const auto& name : m.trainable_names()) {
        if (!owner_.at(name)[static_cast<std::size_t>(d)]) continue;
        const auto g = m.grad(name).local_span(d);
        double s = 0.0;
        for (float v : g) s += static_cast<double>(v) * v;
        sq += s;
      }
      psum(dev, std::span<double>(&sq, 1), all);
      std::lock_guard<std::mutex> lock(mu);
      result = sq;  // the same value on every device
    });
    return std::sqrt(result);
  }

  /// Scales every gradient block by min(1, max_norm / norm) (no-op when max_norm <= 0), as
  /// optim::clip_by_global_norm does on one device; returns the norm before clipping.
  double clip_by_global_norm(ShardedModel& m, double max_norm) const {
    const double norm = global_grad_norm(m);
    if (max_norm > 0 && norm > max_norm) {
      const float s = static_cast<float>(max_norm / (norm + 1e-6));
      m.mesh().run([&](Device& dev) {
        for (const auto& name : m.trainable_names()) {
          auto g = m.grad(name).local_span(dev.id());
          kernels::scale(g.data(), s, static_cast<std::int64_t>(g.size()));
        }
      });
    }
    return norm;
  }

  /// One update of every parameter block, on its device.
  void step(ShardedModel& m, double lr) {
    EDL_CHECK(m.has_grads(), errc::invalid_argument, "ShardedOptimizer", "no gradients yet: call loss_and_grads first");
    m.mesh().run([&](Device& dev) {
      const std::int64_t d = dev.id();
      Optimizer& o = per_device_[static_cast<std::size_t>(d)];
      o.begin_step();
      if (dev.id() == first_local(m)) step_count_ = o.step_count();
      for (const auto& name : m.trainable_names()) {
        auto& p = m.param(name);
        if (!p.layout().holds(d)) continue;  // placed on other devices (an expert on its ep rank)
        const auto w = p.local_span(d);
        const auto g = m.grad(name).local_span(d);
        o.update_tensor(name, w.data(), g.data(), static_cast<std::int64_t>(w.size()), p.global_shape(), lr);
      }
    });
  }

  /// The state a one-device Optimizer would hold (full tensors), for checkpoints: a checkpoint
  /// saved on one mesh loads on any other. On a mesh over several processes every process
  /// calls it (edl::gather completes each tensor from the processes that own its blocks).
  Optimizer gather(const ShardedModel& m) const {
    Optimizer full(opt_);
    full.set_step_count(step_count());
    // The slots every parameter has (the optimizer's kind decides them), seen on this process's
    // devices; every process has taken the same steps, so all see the same names.
    std::set<std::string> slots;
    const CollectiveBackend& be = m.mesh().backend();
    for (std::int64_t d = 0; d < devices_; ++d)
      if (be.is_local(d))
        device(d).visit_state([&](const std::string&, const std::string& slot, const std::vector<float>&) { slots.insert(slot); });
    for (const auto& path : m.trainable_names())
      for (const auto& slot : slots) {
        const ShardLayout& layout = m.param(path).layout();
        std::vector<xt::xarray<float>> blocks;
        for (std::int64_t d = 0; d < devices_; ++d) {
          // Another process's device stores nothing here (gather takes its block from there).
          const auto shape = be.is_local(d) ? layout.local_shape(d) : std::vector<std::int64_t>(layout.rank(), 0);
          xt::xarray<float> b = xt::xarray<float>::from_shape(std::vector<std::size_t>(shape.begin(), shape.end()));
          if (be.is_local(d) && layout.holds(d)) {
            const std::vector<float>* v = device(d).find_slot(path, slot);
            EDL_CHECK(v && static_cast<std::int64_t>(v->size()) == layout.local_elements(d), errc::invalid_argument,
                      path + "." + slot, "device ", d, " does not hold this optimizer slot's block");
            std::copy(v->begin(), v->end(), b.begin());
          }
          blocks.push_back(std::move(b));
        }
        const ShardedArray<float> arr(m.mesh().context(), layout, std::move(blocks));
        const xt::xarray<float> g = edl::gather(arr);
        full.set_slot(path, slot, std::vector<float>(g.begin(), g.end()));
      }
    return full;
  }

  /// Takes the state of a one-device Optimizer (a checkpoint's), each device keeping its blocks.
  void load(const Optimizer& full, const ShardedModel& m) {
    EDL_CHECK(full.options().kind == opt_.kind, errc::config, "ShardedOptimizer",
              "the state is of optimizer ", optimizer_name(full.options().kind), ", this one is ",
              optimizer_name(opt_.kind));
    full.visit_state([&](const std::string& path, const std::string& slot, const std::vector<float>& v) {
      const ShardLayout& layout = m.param(path).layout();
      const auto& gs = layout.global_shape();
      std::int64_t n = 1;
      for (auto x : gs) n *= x;
      EDL_CHECK(static_cast<std::int64_t>(v.size()) == n, errc::shape_mismatch, path + "." + slot,
                "optimizer state holds ", v.size(), " values, the parameter has ", n);
      xt::xarray<float> g = xt::xarray<float>::from_shape(std::vector<std::size_t>(gs.begin(), gs.end()));
      std::copy(v.begin(), v.end(), g.begin());
      const ShardedArray<float> arr = shard(g, layout, m.mesh().context());
      for (std::int64_t d = 0; d < devices_; ++d) {
        if (!layout.holds(d) || !arr.has_block(d)) continue;
        const auto b = arr.local_span(d);
        per_device_[static_cast<std::size_t>(d)].set_slot(path, slot, std::vector<float>(b.begin(), b.end()));
      }
    });
    set_step_count(full.step_count());
  }

 private:
  static std::int64_t first_local(const ShardedModel& m) {
    std::int64_t d = 0;
    while (d + 1 < m.mesh().size() && !m.mesh().backend().is_local(d)) ++d;
    return d;
  }

  template <class MeshT>
  static AxisList all_axes(const MeshT&) {
    std::vector<std::string> v;
    for (const auto& n : MeshT::axis_names) v.emplace_back(n.view());
    return AxisList(std::move(v));
  }

  OptimizerOptions opt_;
  std::int64_t devices_ = 1;
  std::int64_t step_count_ = 0;  // updates applied (read from this process's first device)
  std::vector<Optimizer> per_device_;
  std::map<std::string, std::vector<char>> owner_;  // name -> device holds a distinct block
};

}  // namespace edl::optim
