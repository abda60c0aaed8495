// edl/io/atomic_file.hpp
// Write a file so that readers see either the old contents or the complete new ones:
// write "<path>.tmp-<pid>", fsync it, rename it over <path>, fsync the folder. If anything
// throws before commit(), the destructor removes the temp file and <path> is untouched.
#pragma once

#include <cerrno>
#include <cstddef>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <edl/core/error.hpp>
#include <edl/io/mmap.hpp>

namespace edl::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path)
      : path_(std::move(path)), tmp_(path_ + ".tmp-" + std::to_string(static_cast<long>(::getpid()))) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EDL_CHECK(fd_ >= 0, errc::io, path_, "cannot create temporary file ", tmp_, ": ", detail::errno_text());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  const std::string& temp_path() const noexcept { return tmp_; }

  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ::ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      EDL_CHECK(w > 0, errc::io, path_, "write to ", tmp_, " failed after ", written_, " bytes: ", detail::errno_text());
      p += w;
      n -= static_cast<std::size_t>(w);
      written_ += static_cast<std::size_t>(w);
    }
  }
  std::size_t bytes_written() const noexcept { return written_; }

  /// fsync, close and rename over the destination; the old file is replaced in one step.
  void commit() {
    EDL_CHECK(::fsync(fd_) == 0, errc::io, path_, "fsync of ", tmp_, " failed: ", detail::errno_text());
    const int fd = fd_;
    fd_ = -1;
    EDL_CHECK(::close(fd) == 0, errc::io, path_, "close of ", tmp_, " failed: ", detail::errno_text());
    EDL_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, errc::io, path_, "rename from ", tmp_,
              " failed: ", detail::errno_text());
    committed_ = true;
    // Make the rename itself durable (best effort: some file systems refuse fsync on folders).
    const auto slash = path_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::size_t written_ = 0;
};

/// Writes a whole string atomically.
inline void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

}  // namespace edl::io
