// oomb trainer — files and directories that appear whole or not at all.
// SPDX-License-Identifier: Apache-2.0
//
// atomic_file writes into a temporary file beside the target and renames it over the target on
// commit(); atomic_directory does the same for a whole folder (a checkpoint). Both fsync what they
// wrote before the rename and the parent folder after it, so a crash at any moment leaves either
// the previous version or the new one, never a mix. Uncommitted temporaries are removed by the
// destructor (after a crash they stay, under a name starting with the target's and containing
// ".tmp-", which readers never open).
#pragma once

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <stdlib.h>
#include <sys/stat.h>  // chmod, umask
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "oomb/core/error.hpp"

namespace oomb_trainer {

namespace detail {

inline std::string parent_dir_of(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

inline void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  OOMB_CHECK(fd >= 0, oomb::error, path, ": cannot open to fsync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (tmpfs on old kernels, some FUSE) refuse fsync on folders: not an error.
  OOMB_CHECK(rc == 0 || err == EINVAL || err == EROFS, oomb::error, path, ": fsync failed: ",
             std::strerror(err));
}

/// The process's file mode creation mask (read by setting it and putting it back: POSIX has no
/// query; files and folders are created on the host thread only).
inline mode_t process_umask() noexcept {
  const mode_t m = ::umask(0);
  ::umask(m);
  return m;
}

/// Replaces folder `target` by folder `tmp` where renameat2(RENAME_EXCHANGE) is not available:
/// the old folder is renamed aside to "<target>.old-XXXXXX", `tmp` renamed to `target`, the old one
/// deleted. If the second rename fails, the old folder is put back.
inline void replace_dir_by_two_renames(const std::string& tmp, const std::string& target) {
  std::string old_tmpl = target + ".old-XXXXXX";
  std::vector<char> buf(old_tmpl.begin(), old_tmpl.end());
  buf.push_back('\0');
  OOMB_CHECK(::mkdtemp(buf.data()) != nullptr, oomb::error, target,
             ": cannot create a folder to move the previous version aside: ", std::strerror(errno));
  const std::string old(buf.data());
  if (::rename(target.c_str(), old.c_str()) != 0) {
    const int err = errno;
    ::rmdir(old.c_str());
    OOMB_FAIL(oomb::error, target, ": cannot move the previous version aside to ", old, ": ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    (void)::rename(old.c_str(), target.c_str());  // put the previous version back
    OOMB_FAIL(oomb::error, target, ": cannot rename the temporary folder ", tmp, " to it: ", std::strerror(err));
  }
  fsync_path(parent_dir_of(target), true);
  std::error_code ec;
  std::filesystem::remove_all(old, ec);
}

inline void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    OOMB_CHECK(w > 0, oomb::error, path, ": write failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace detail

/// A file written under a temporary name and renamed to `path` by commit().
class atomic_file {
 public:
  explicit atomic_file(std::string path) : path_(std::move(path)) {
    OOMB_EXPECTS(!path_.empty(), "atomic_file: empty path");
    std::string tmpl = path_ + ".tmp-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
    OOMB_CHECK(fd_ >= 0, oomb::error, path_, ": cannot create a temporary file beside it: ",
               std::strerror(errno));
    tmp_.assign(buf.data());
  }
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  }

  const std::string& path() const noexcept { return path_; }
  const std::string& temporary_path() const noexcept { return tmp_; }

  void write(const void* data, std::size_t n) {
    OOMB_EXPECTS(fd_ >= 0 && !committed_, path_, ": write after commit");
    detail::write_all(fd_, data, n, tmp_);
  }

  /// Flushes the data to disk and renames the temporary over the target.
  void commit() {
    OOMB_EXPECTS(fd_ >= 0 && !committed_, path_, ": committed twice");
    OOMB_CHECK(::fsync(fd_) == 0, oomb::error, tmp_, ": fsync failed: ", std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    OOMB_CHECK(rc == 0, oomb::error, tmp_, ": close failed: ", std::strerror(errno));
    OOMB_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, oomb::error, path_,
               ": cannot rename the temporary ", tmp_, " over it: ", std::strerror(errno));
    committed_ = true;
    detail::fsync_path(detail::parent_dir_of(path_), true);
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `n` bytes to `path` atomically.
inline void write_file_atomically(const std::string& path, const void* data, std::size_t n) {
  atomic_file f(path);
  f.write(data, n);
  f.commit();
}

/// A folder filled under a temporary name (`<path>.tmp-XXXXXX`, beside the target) and swapped in
/// by commit(). If `path` already exists the two are exchanged in one atomic renameat2
/// (RENAME_EXCHANGE) and the old contents removed; where the file system cannot exchange, the old
/// folder is first renamed aside to `<path>.old-XXXXXX` (a crash between the two renames then
/// leaves both complete versions on disk under those names, and `path` missing).
class atomic_directory {
 public:
  explicit atomic_directory(std::string path) : path_(std::move(path)) {
    while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
    OOMB_EXPECTS(!path_.empty() && path_ != "/", "atomic_directory: bad path '", path_, "'");
    std::string tmpl = path_ + ".tmp-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    OOMB_CHECK(::mkdtemp(buf.data()) != nullptr, oomb::error, path_,
               ": cannot create a temporary folder beside it: ", std::strerror(errno));
    tmp_.assign(buf.data());
    // mkdtemp makes it 0700; the folder it becomes gets what mkdir would give it.
    OOMB_CHECK(::chmod(tmp_.c_str(), 0777 & ~detail::process_umask()) == 0, oomb::error, tmp_, ": cannot set its permissions: ",
               std::strerror(errno));
  }
  atomic_directory(const atomic_directory&) = delete;
  atomic_directory& operator=(const atomic_directory&) = delete;
  ~atomic_directory() {
    if (!committed_) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_, ec);  // best effort: a destructor must not throw
    }
  }

  const std::string& path() const noexcept { return path_; }
  /// Where to write the folder's files before commit().
  const std::string& temporary_path() const noexcept { return tmp_; }
  std::string file(const std::string& name) const { return tmp_ + "/" + name; }

  /// fsyncs the temporary folder and its files, then swaps it in for `path`.
  void commit() {
    OOMB_EXPECTS(!committed_, path_, ": committed twice");
    for (const auto& entry : std::filesystem::directory_iterator(tmp_))
      if (entry.is_regular_file()) detail::fsync_path(entry.path().string(), false);
    detail::fsync_path(tmp_, true);
    const std::string parent = detail::parent_dir_of(path_);
    std::error_code ec;
    const bool exists = std::filesystem::exists(path_, ec);
    if (!exists) {
      OOMB_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, oomb::error, path_,
                 ": cannot rename the temporary folder ", tmp_, " to it: ", std::strerror(errno));
      committed_ = true;
      detail::fsync_path(parent, true);
      return;
    }
    OOMB_CHECK(std::filesystem::is_directory(path_, ec), oomb::error, path_,
               ": exists and is not a folder; refusing to replace it");
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0) {
      committed_ = true;
      detail::fsync_path(parent, true);
      std::filesystem::remove_all(tmp_, ec);  // now holds the previous version
      return;
    }
    OOMB_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, oomb::error, path_,
               ": cannot exchange it with the temporary folder ", tmp_, ": ", std::strerror(errno));
#endif
    detail::replace_dir_by_two_renames(tmp_, path_);
    committed_ = true;
  }

 private:
  std::string path_;
  std::string tmp_;
  bool committed_ = false;
};

}  // namespace oomb_trainer
