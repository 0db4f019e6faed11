#include "gradaccum/base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "gradaccum/base/check.h"

namespace gradaccum::base {

namespace fs = std::filesystem;

namespace {

fs::path directory_of(const fs::path& path) { return path.has_parent_path() ? path.parent_path() : fs::path("."); }

std::string temporary_beside(const fs::path& path, const std::string& role) {
  return (directory_of(path) /
          (std::string(kTemporaryPrefix) + role + std::to_string(::getpid()) + "-" + path.filename().string()))
      .string();
}

// Renames the written (and fsynced) temporary over `path` and makes the rename durable; the
// temporary is removed if the rename fails.
void rename_over(const std::string& temporary, const std::string& path) {
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw Error(fmt::format("{}: cannot rename {} over it: {}", path, temporary, std::strerror(error)));
  }
  fsync_directory(directory_of(path).string());
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string temporary = temporary_beside(path, "");
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  GA_CHECK(fd >= 0, "{}: cannot create {}: {}", path, temporary, std::strerror(errno));
  auto fail = [&](const char* step, int error) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw Error(fmt::format("{}: {} failed: {}", path, step, std::strerror(error)));
  };
  for (const auto bytes : pieces) {
    size_t written = 0;
    while (written < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write", errno);
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) fail("fsync", errno);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw Error(fmt::format("{}: close failed: {}", path, std::strerror(error)));
  }
  rename_over(temporary, path);
}

void write_file_atomically_with(const std::string& path,
                                const std::function<void(const std::string& temporary)>& write_to) {
  const std::string temporary = temporary_beside(path, "");
  try {
    write_to(temporary);
    fsync_file(temporary);
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  rename_over(temporary, path);
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  write_file_atomically_with(to, [&](const std::string& temporary) {
    std::error_code ec;
    fs::copy_file(from, temporary, fs::copy_options::overwrite_existing, ec);
    GA_CHECK(!ec, "{}: cannot copy {} to it: {}", to, from, ec.message());
  });
}

void replace_directory(const std::string& staging, const std::string& target_dir) {
  fs::path target(target_dir);
  if (!target.has_filename()) target = target.parent_path();  // "out/final/" → "out/final"
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    GA_CHECK(::rename(staging.c_str(), target.c_str()) == 0, "{}: cannot rename {} to it: {}", target.string(), staging,
             std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(staging, ec);  // now the old one
  } else {
    const std::string old = temporary_beside(target, "old-");
    fs::remove_all(old, ec);
    GA_CHECK(::rename(target.c_str(), old.c_str()) == 0, "{}: cannot move the old one aside to {}: {}", target.string(),
             old, std::strerror(errno));
    if (::rename(staging.c_str(), target.c_str()) != 0) {
      const int error = errno;
      ::rename(old.c_str(), target.c_str());
      throw Error(fmt::format("{}: cannot rename {} to it: {}", target.string(), staging, std::strerror(error)));
    }
    fs::remove_all(old, ec);
  }
  fsync_directory(directory_of(target).string());
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  GA_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  GA_CHECK(rc == 0, "{}: cannot fsync: {}", path, std::strerror(saved));
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  GA_CHECK(fd >= 0, "{}: cannot open directory: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  GA_CHECK(rc == 0, "{}: cannot fsync directory: {}", path, std::strerror(saved));
}

}  // namespace gradaccum::base
