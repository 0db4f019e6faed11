// A small tmpfs for the full-disk tests: mounted on a fresh directory for the guard's lifetime,
// or not at all where this process may not mount one (path() is then "" and why() says why, for
// the test's skip).
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "test_support.h"

namespace gradaccum::testing {

class SmallTmpfs {
 public:
  // `size` as mount(8) spells it: "16k", "1600000".
  SmallTmpfs(const std::string& name, const std::string& size) {
    const auto dir = make_temp_dir(name) + "/mnt";
    std::filesystem::create_directories(dir);
    if (mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, ("size=" + size).c_str()) == 0) {
      path_ = dir;
    } else {
      why_ = std::string("cannot mount a tmpfs (") + std::strerror(errno) + "; it needs CAP_SYS_ADMIN)";
    }
  }
  ~SmallTmpfs() {
    if (!path_.empty()) umount2(path_.c_str(), MNT_DETACH);
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;
  const std::string& path() const { return path_; }
  const std::string& why() const { return why_; }

 private:
  std::string path_, why_;
};

}  // namespace gradaccum::testing
