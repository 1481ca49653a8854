// oomb trainer — random-access bytes from a file (pread) or from memory, for the file readers.
// SPDX-License-Identifier: Apache-2.0
//
// The readers (safetensors, token files) validate a file's structure once and then read ranges
// of it. They read through this class so the same validating code runs on files and on memory
// buffers (tests, fuzz targets). Files are read with pread, not mmap: a file truncated under a
// reader then gives an error instead of SIGBUS.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "oomb/core/error.hpp"

namespace oomb_trainer {

class byte_source {
 public:
  /// Opens `path` for reading. Throws oomb::error when it cannot be opened or is not a file.
  static byte_source open_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OOMB_CHECK(fd >= 0, oomb::error, path, ": cannot open: ", std::strerror(errno));
    auto owner = std::shared_ptr<int>(new int(fd), [](int* p) {
      ::close(*p);
      delete p;
    });
    struct stat st {};
    OOMB_CHECK(::fstat(fd, &st) == 0, oomb::error, path, ": cannot stat: ", std::strerror(errno));
    OOMB_CHECK(S_ISREG(st.st_mode), oomb::error, path, ": not a regular file");
    byte_source s;
    s.name_ = path;
    s.fd_ = std::move(owner);
    s.size_ = static_cast<std::uint64_t>(st.st_size);
    return s;
  }

  /// A non-owning view of `size` bytes at `data`, called `name` in error messages. The bytes must
  /// outlive every reader made from this source.
  static byte_source from_memory(std::string name, const void* data, std::size_t size) {
    OOMB_EXPECTS(data != nullptr || size == 0, "byte_source::from_memory: null data with size ", size);
    byte_source s;
    s.name_ = std::move(name);
    s.memory_ = static_cast<const unsigned char*>(data);
    s.size_ = size;
    return s;
  }

  const std::string& name() const noexcept { return name_; }
  std::uint64_t size() const noexcept { return size_; }

  /// Copies bytes [offset, offset + n) into dst. A range past the end is a format_error (the file
  /// shrank after it was validated, or a caller's bug); a failed read is an oomb::error.
  void read(std::uint64_t offset, void* dst, std::size_t n) const {
    OOMB_CHECK(offset <= size_ && n <= size_ - offset, oomb::format_error, name_,
               ": read of ", n, " bytes at offset ", offset, " runs past the end (", size_, " bytes)");
    if (n == 0) return;
    if (!fd_) {
      std::memcpy(dst, memory_ + offset, n);
      return;
    }
    auto* out = static_cast<unsigned char*>(dst);
    while (n > 0) {
      const ssize_t got = ::pread(*fd_, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      OOMB_CHECK(got >= 0, oomb::error, name_, ": read failed at offset ", offset, ": ",
                 std::strerror(errno));
      OOMB_CHECK(got > 0, oomb::format_error, name_, ": file is shorter than expected (ends before offset ",
                 offset, "); was it truncated while being read?");
      out += got;
      offset += static_cast<std::uint64_t>(got);
      n -= static_cast<std::size_t>(got);
    }
  }

 private:
  byte_source() = default;

  std::string name_;
  std::shared_ptr<int> fd_;                  // set for files
  const unsigned char* memory_ = nullptr;    // set for memory views
  std::uint64_t size_ = 0;
};

}  // namespace oomb_trainer
