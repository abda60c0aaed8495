// edl/models/llama/checkpoint_source.hpp: where a checkpoint object's tensors come from, for
// the errors that name them. Any checkpoint the loaders take (io::ShardedCheckpoint,
// io::SafeTensorsFile, or a view over one such as FusedCheckpointView and
// TransformedCheckpoint) answers through these two, so the views need no copies of their own.
#pragma once

#include <string>

namespace edl::models::detail {

/// The checkpoint's name for errors: the index, or the single file.
template <class Ckpt>
std::string checkpoint_source(const Ckpt& c) {
  if constexpr (requires { c.index_path(); c.files(); }) {
    if (!c.index_path().empty()) return c.index_path();
    const auto f = c.files();
    return f.empty() ? std::string("checkpoint") : f.front();
  } else if constexpr (requires { c.path(); }) {
    return c.path();
  } else {
    return "checkpoint";
  }
}

/// The file holding tensor `name` (a sharded checkpoint's shard), else the checkpoint's name.
template <class Ckpt>
std::string file_of(const Ckpt& c, const std::string& name) {
  if constexpr (requires { c.file_of(name); }) return c.file_of(name);
  else return checkpoint_source(c);
}

}  // namespace edl::models::detail
