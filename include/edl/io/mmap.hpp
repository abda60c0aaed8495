// edl/io/mmap.hpp
// A read-only memory map of a whole file (POSIX mmap), owned RAII-style.
//
//   edl::io::MappedFile f("model.safetensors");
//   std::span<const std::byte> bytes = f.bytes();
//
// Errors are edl::Error(errc::io) naming the file and the errno text. An empty file maps to
// an empty span (mmap of length 0 is not allowed, so nothing is mapped).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <edl/core/error.hpp>

namespace edl::io {

namespace detail {
/// "No such file or directory (errno 2)" for the current errno (or a given one).
inline std::string errno_text(int err = errno) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}
}  // namespace detail

/// The whole file as a string (errors name the file).
inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", detail::errno_text());
  std::stringstream ss;
  ss << in.rdbuf();
  EDL_CHECK(!in.bad(), errc::io, path, "read failed: ", detail::errno_text());
  return ss.str();
}

class MappedFile {
 public:
  MappedFile() = default;

  explicit MappedFile(std::string path) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    EDL_CHECK(fd >= 0, errc::io, path_, "cannot open for reading: ", detail::errno_text());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      ::edl::detail::raise(errc::io, path_, "cannot stat: " + detail::errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      ::edl::detail::raise(errc::io, path_, "not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        size_ = 0;
        ::edl::detail::raise(errc::io, path_, "cannot memory-map " + std::to_string(st.st_size) +
                                                  " bytes: " + detail::errno_text(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping stays valid after close
  }

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept
      : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~MappedFile() { unmap(); }

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  const std::string& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace edl::io
