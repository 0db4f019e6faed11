// base/files.h: files and directories written whole or not at all, each failure one line.
#include "gradaccum/base/files.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "gradaccum/base/check.h"
#include "test_support.h"

namespace files_test {

namespace fs = std::filesystem;
namespace base = gradaccum::base;
using gradaccum::testing::error_of;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_text;

// The names in `dir`: what a write left behind, temporaries included.
std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

void write_plainly(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(Files, WritesTheBytesAndLeavesNoTemporary) {
  const auto dir = make_temp_dir("files-write");
  base::write_file_atomically(dir + "/one.json", "{\"a\": 1}\n");
  base::write_file_atomically(dir + "/pieces.bin", std::vector<std::string_view>{"head", "", "er", "s"});
  EXPECT_EQ(read_text(dir + "/one.json"), "{\"a\": 1}\n");
  EXPECT_EQ(read_text(dir + "/pieces.bin"), "headers");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"one.json", "pieces.bin"}));
}

TEST(Files, ReplacesAnExistingFileWhole) {
  const auto dir = make_temp_dir("files-replace");
  const auto path = dir + "/summary.json";
  write_plainly(path, std::string(10000, 'x'));
  base::write_file_atomically(path, "short");
  EXPECT_EQ(read_text(path), "short");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"summary.json"});
}

TEST(Files, AnUnwritableDirectoryIsOneLineNamingThePath) {
  const auto dir = make_temp_dir("files-unwritable");
  write_plainly(dir + "/a-file", "");
  const auto path = dir + "/a-file/out.json";
  EXPECT_EQ(error_of([&] { base::write_file_atomically(path, "x"); }),
            fmt::format("{}: cannot create {}/a-file/.tmp-{}-out.json: Not a directory", path, dir, ::getpid()));
  EXPECT_EQ(error_of([&] { base::write_file_atomically(dir + "/absent/out.json", "x"); }),
            fmt::format("{0}/absent/out.json: cannot create {0}/absent/.tmp-{1}-out.json: No such file or directory",
                        dir, ::getpid()));
  EXPECT_EQ(names_in(dir), std::set<std::string>{"a-file"});
}

TEST(Files, AFailedWriteLeavesTheOldFileIntact) {
  const auto dir = make_temp_dir("files-failed-write");
  const auto path = dir + "/state.json";
  write_plainly(path, "old content");
  // A file-size limit makes write() itself fail (EFBIG) after part of the bytes, for any user.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const auto message = error_of([&] { base::write_file_atomically(path, std::string(65536, 'n')); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(message, path + ": write failed: File too large");
  EXPECT_EQ(read_text(path), "old content");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"state.json"});
}

TEST(Files, AWriterThatFailsLeavesTheOldFileAndNoTemporary) {
  const auto dir = make_temp_dir("files-writer");
  const auto path = dir + "/trace.json";
  write_plainly(path, "old trace");
  EXPECT_EQ(error_of([&] {
              base::write_file_atomically_with(path, [](const std::string& temporary) {
                write_plainly(temporary, "half");
                throw gradaccum::Error("the writer stopped");
              });
            }),
            "the writer stopped");
  EXPECT_EQ(read_text(path), "old trace");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"trace.json"});

  base::write_file_atomically_with(path, [](const std::string& temporary) { write_plainly(temporary, "new trace"); });
  EXPECT_EQ(read_text(path), "new trace");
  // A writer that writes nothing is an error, not an empty file.
  EXPECT_EQ(error_of([&] { base::write_file_atomically_with(path, [](const std::string&) {}); }),
            fmt::format("{}/.tmp-{}-trace.json: cannot open: No such file or directory", dir, ::getpid()));
  EXPECT_EQ(read_text(path), "new trace");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"trace.json"});
}

TEST(Files, CopiesAFile) {
  const auto dir = make_temp_dir("files-copy");
  write_plainly(dir + "/from.txt", "tokenizer");
  write_plainly(dir + "/to.txt", "older and longer");
  base::copy_file_atomically(dir + "/from.txt", dir + "/to.txt");
  EXPECT_EQ(read_text(dir + "/to.txt"), "tokenizer");
  EXPECT_EQ(error_of([&] {
              base::copy_file_atomically(dir + "/absent.txt", dir + "/to.txt");
            }).rfind(dir + "/to.txt: cannot copy " + dir + "/absent.txt to it: ", 0),
            0u);
  EXPECT_EQ(read_text(dir + "/to.txt"), "tokenizer");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"from.txt", "to.txt"}));
}

TEST(Files, ReplacesADirectoryWhole) {
  const auto dir = make_temp_dir("files-directory");
  fs::create_directories(dir + "/staging");
  write_plainly(dir + "/staging/model.safetensors", "first");
  base::replace_directory(dir + "/staging", dir + "/final");  // nothing there yet
  EXPECT_EQ(read_text(dir + "/final/model.safetensors"), "first");

  fs::create_directories(dir + "/staging");
  write_plainly(dir + "/staging/config.json", "second");
  base::replace_directory(dir + "/staging", dir + "/final/");
  EXPECT_EQ(names_in(dir + "/final"), std::set<std::string>{"config.json"});  // the old files went with it
  EXPECT_EQ(read_text(dir + "/final/config.json"), "second");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"final"});

  EXPECT_EQ(error_of([&] { base::replace_directory(dir + "/absent", dir + "/other"); }),
            fmt::format("{0}/other: cannot rename {0}/absent to it: No such file or directory", dir));
}

}  // namespace files_test
