// edl/io/planned_safetensors.hpp
// A folder of safetensors files laid out before any tensor's bytes exist, then filled block by
// block: from one process, or from several at once, each writing the blocks it holds. This is
// how a sharded model is saved without any process ever holding a whole tensor of it.
//
//   io::PlannedFolder plan({{"w", {DType::f32, {4, 8}}}, ...}, 5'000'000'000, {{"format", "pt"}});
//   plan.create(dir);                  // one process: every file's header and size, the index
//   io::PlannedWriter w(dir, plan);    // then every process
//   w.write("w", byte_offset, bytes);  // any byte range of a tensor, in any order
//   w.sync();                          // fsync what this process wrote
//
// The files are the ones save_sharded writes for the same tensors (the same cut into shards,
// the same header, the same order), so a folder filled block by block is byte for byte the
// folder written whole. create() sizes each file with ftruncate, so a range nobody writes
// reads as zeros; PlannedWriter refuses a range outside its tensor.
//
// Not atomic by itself: a checkpoint writes into a temporary folder and renames it once every
// process has written and synced its part (train/checkpoint.hpp).
#pragma once

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/io/safetensors.hpp>

namespace edl::io {

/// A tensor's dtype and shape, before its bytes exist.
struct TensorShape {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const {
    std::uint64_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

/// Tensors to lay out, in file order.
using TensorShapes = std::vector<std::pair<std::string, TensorShape>>;

/// Which file holds each tensor and at which byte its data starts.
class PlannedFolder {
 public:
  struct Place {
    std::size_t file = 0;       // index into files()
    std::uint64_t offset = 0;   // of the tensor's first byte in its file
    std::uint64_t bytes = 0;
  };
  struct File {
    std::string name;    // "model.safetensors", "model-00001-of-00002.safetensors", ...
    std::string header;  // padded JSON, without the 8-byte length
    std::uint64_t size = 0;
  };

  PlannedFolder() = default;
  /// `tensors` cut into files of at most `max_shard_bytes` as save_sharded cuts them; `single`
  /// names the file when one holds everything (model.safetensors; another name, e.g.
  /// "optimizer.safetensors", for a file that is not a model's).
  PlannedFolder(const TensorShapes& tensors, std::uint64_t max_shard_bytes,
                const std::map<std::string, std::string>& metadata = {}, std::string single = kSingleFileName) {
    EDL_CHECK(max_shard_bytes > 0, errc::invalid_argument, "io.PlannedFolder", "max_shard_bytes must be positive");
    std::vector<std::uint64_t> sizes;
    for (const auto& [name, t] : tensors) {
      EDL_CHECK(!name.empty() && name != "__metadata__", errc::invalid_argument, "io.PlannedFolder",
                "invalid tensor name \"", name, "\"");
      for (auto d : t.shape)
        EDL_CHECK(d >= 0, errc::invalid_argument, name, "negative extent in shape ", ::edl::detail::shape_str(t.shape));
      sizes.push_back(t.bytes());
    }
    std::vector<std::size_t> first = detail::shard_starts(sizes, max_shard_bytes);
    if (first.empty()) first.push_back(0);
    std::map<std::string, std::string> weight_map;
    std::uint64_t total = 0;
    for (std::size_t f = 0; f < first.size(); ++f) {
      const std::size_t end = f + 1 < first.size() ? first[f + 1] : tensors.size();
      const TensorShapes part(tensors.begin() + static_cast<std::ptrdiff_t>(first[f]),
                              tensors.begin() + static_cast<std::ptrdiff_t>(end));
      File file;
      file.name = first.size() == 1 ? single : shard_file_name(f + 1, first.size());
      file.header = detail::build_header(part, [](const TensorShape& t) { return t.bytes(); }, metadata);
      std::uint64_t off = 8 + file.header.size();
      for (const auto& [name, t] : part) {
        EDL_CHECK(places_.emplace(name, Place{f, off, t.bytes()}).second, errc::invalid_argument, name,
                  "listed twice");
        weight_map[name] = file.name;
        off += t.bytes();
        total += t.bytes();
      }
      file.size = off;
      files_.push_back(std::move(file));
    }
    if (files_.size() > 1) index_ = detail::index_json(total, weight_map);
  }

  const std::vector<File>& files() const noexcept { return files_; }
  /// The index's text (model.safetensors.index.json), empty for one file.
  const std::string& index() const noexcept { return index_; }
  bool contains(const std::string& name) const { return places_.count(name) > 0; }
  const Place& place(const std::string& name) const {
    const auto it = places_.find(name);
    EDL_CHECK(it != places_.end(), errc::invalid_argument, name, "is not a tensor of this plan");
    return it->second;
  }

  /// Writes every file's length and header and sets its size (the data region reads as zeros
  /// until written), and the index when there are several files. One process calls it.
  void create(const std::filesystem::path& dir) const {
    for (const File& f : files_) {
      const std::string path = (dir / f.name).string();
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      EDL_CHECK(fd >= 0, errc::io, path, "cannot create: ", detail::errno_text());
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      const std::uint64_t n = f.header.size();
      write_at(fd, path, &n, 8, 0);
      write_at(fd, path, f.header.data(), f.header.size(), 8);
      EDL_CHECK(::ftruncate(fd, static_cast<off_t>(f.size)) == 0, errc::io, path, "cannot set the size to ", f.size,
                " bytes: ", detail::errno_text());
      EDL_CHECK(::fsync(fd) == 0, errc::io, path, "fsync failed: ", detail::errno_text());
    }
    if (!index_.empty()) write_file_atomic((dir / kIndexFileName).string(), index_);
  }

  /// pwrite of all `n` bytes at `offset` (retrying short writes).
  static void write_at(int fd, const std::string& path, const void* data, std::size_t n, std::uint64_t offset) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      EDL_CHECK(w > 0, errc::io, path, "write of ", n, " bytes at offset ", offset, " failed: ", detail::errno_text());
      p += w;
      n -= static_cast<std::size_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }

 private:
  std::vector<File> files_;
  std::map<std::string, Place> places_;
  std::string index_;
};

/// Writes byte ranges of a planned folder's tensors into the files create() made.
class PlannedWriter {
 public:
  PlannedWriter(std::filesystem::path dir, const PlannedFolder& plan)
      : dir_(std::move(dir)), plan_(&plan), fds_(plan.files().size(), -1) {}
  PlannedWriter(const PlannedWriter&) = delete;
  PlannedWriter& operator=(const PlannedWriter&) = delete;
  ~PlannedWriter() {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }

  /// Writes `bytes` at byte `offset` of tensor `name`'s data.
  void write(const std::string& name, std::uint64_t offset, std::span<const std::byte> bytes) {
    const PlannedFolder::Place& p = plan_->place(name);
    EDL_CHECK(offset <= p.bytes && bytes.size() <= p.bytes - offset, errc::invalid_argument, name, "bytes ", offset,
              "..", offset + bytes.size(), " are outside the tensor's ", p.bytes, " bytes");
    const std::string path = (dir_ / plan_->files()[p.file].name).string();
    int& fd = fds_[p.file];
    if (fd < 0) {
      fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      EDL_CHECK(fd >= 0, errc::io, path, "cannot open for writing (was the folder created?): ", detail::errno_text());
    }
    PlannedFolder::write_at(fd, path, bytes.data(), bytes.size(), p.offset + offset);
    written_ += bytes.size();
  }

  /// fsyncs and closes every file this writer wrote to.
  void sync() {
    for (std::size_t f = 0; f < fds_.size(); ++f) {
      if (fds_[f] < 0) continue;
      const std::string path = (dir_ / plan_->files()[f].name).string();
      const int fd = fds_[f];
      fds_[f] = -1;
      const bool synced = ::fsync(fd) == 0;
      const std::string why = synced ? std::string() : detail::errno_text();
      ::close(fd);
      EDL_CHECK(synced, errc::io, path, "fsync failed: ", why);
    }
  }
  std::uint64_t bytes_written() const noexcept { return written_; }

 private:
  std::filesystem::path dir_;
  const PlannedFolder* plan_;
  std::vector<int> fds_;
  std::uint64_t written_ = 0;
};

}  // namespace edl::io
