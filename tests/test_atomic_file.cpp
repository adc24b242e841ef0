// The one atomic writer (common/atomic_file.hpp) and the output-path checks made before any work.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>

#include "common/atomic_file.hpp"
#include "common/error.hpp"
#include "test_support.hpp"

namespace trainyard {

namespace fs = std::filesystem;

using test::error_of;

namespace {

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.push_back(entry.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(AtomicFile, WritesBytesAndStreamsAndReplacesWithNothingLeftBeside) {
  test::TempDir dir;
  const std::string path = (dir.path() / "out.json").string();
  write_file_atomically(path, std::string_view("first\n"));
  EXPECT_EQ(test::read_file(path), "first\n");
  write_file_atomically(path, [](std::ostream& out) {
    for (int i = 0; i < 100000; ++i) out << i << "\n";  // more than the 64 KiB buffer
  });
  const std::string text = test::read_file(path);
  EXPECT_TRUE(text.starts_with("0\n1\n2\n")) << text.substr(0, 20);
  EXPECT_TRUE(text.ends_with("99999\n"));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"out.json"});
}

TEST(AtomicFile, AnExceptionWhileWritingLeavesTheOldFileAndNoTemporary) {
  test::TempDir dir;
  const std::string path = dir.write("plan.json", "old");
  EXPECT_THROW(write_file_atomically(path,
                                     [](std::ostream& out) {
                                       out << "half of it";
                                       throw std::runtime_error("interrupted");
                                     }),
               std::runtime_error);
  EXPECT_EQ(test::read_file(path), "old");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"plan.json"});
}

// A full disk, simulated with the file-size limit: the write error is reported (std::ofstream's flush used to be
// the only check), the temporary file goes, the old file stays. In a child process: the limit is per process.
TEST(AtomicFile, AWriteErrorIsReportedAndCleanedUp) {
  test::TempDir dir;
  const std::string path = dir.write("trace.json", "old");
  const auto attempt = [&] {
    std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing the process
    rlimit limit{4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    const std::string message = error_of([&] { write_file_atomically(path, [](std::ostream& out) { out << std::string(1 << 20, 'x'); }); });
    const bool reported = message.find("trace.json") != std::string::npos && message.find("writing it failed") != std::string::npos;
    const bool clean = test::read_file(path) == "old" && names_in(dir.path()) == std::vector<std::string>{"trace.json"};
    std::_Exit(reported && clean ? 0 : 1);
  };
  EXPECT_EXIT(attempt(), ::testing::ExitedWithCode(0), "");
}

TEST(AtomicFile, ADeviceIsRefusedAndLeftAlone) {
  struct stat before {};
  ASSERT_EQ(::stat("/dev/full", &before), 0);
  const std::string message = error_of([] { write_file_atomically("/dev/full", std::string_view("x")); });
  EXPECT_NE(message.find("/dev/full"), std::string::npos) << message;
  EXPECT_NE(message.find("character device"), std::string::npos) << message;
  struct stat after {};
  ASSERT_EQ(::stat("/dev/full", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(after.st_rdev, before.st_rdev);
}

TEST(AtomicFile, ASymlinkIsFollowedAndAFilesModeKept) {
  test::TempDir dir;
  const std::string target = dir.write("real.json", "old");
  ::chmod(target.c_str(), 0640);
  const fs::path link = dir.path() / "link.json";
  fs::create_symlink(target, link);
  write_file_atomically(link.string(), std::string_view("new"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(test::read_file(target), "new");
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST(AtomicFile, CheckWritableNamesTheFlagAndWhatIsWrong) {
  test::TempDir dir;
  check_writable((dir.path() / "new.json").string(), "--out");  // a new file in an existing folder: fine
  EXPECT_TRUE(names_in(dir.path()).empty()) << "the probe file is removed";
  struct Case {
    std::string path, says;
  };
  for (const Case& c : {Case{(dir.path() / "missing" / "p.json").string(), "does not exist"}, Case{dir.path().string(), "is a directory"},
                        Case{"/dev/full", "is a character device, not a regular file"}, Case{"", "is empty"},
                        Case{dir.write("file", "x") + "/p.json", "is not a folder"}}) {
    SCOPED_TRACE(c.path);
    const std::string message = error_of([&] { check_writable(c.path, "--trace"); });
    EXPECT_TRUE(message.starts_with("--trace: ")) << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
  }
  const fs::path dangling = dir.path() / "dangling.json";
  fs::create_symlink(dir.path() / "nowhere" / "x.json", dangling);
  EXPECT_NE(error_of([&] { check_writable(dangling.string(), "--out"); }).find("symbolic link to a missing file"), std::string::npos);
  if (::geteuid() != 0) {  // root writes anywhere
    const fs::path locked = dir.path() / "locked";
    fs::create_directory(locked);
    ::chmod(locked.c_str(), 0555);
    EXPECT_NE(error_of([&] { check_writable((locked / "p.json").string(), "--out"); }).find("no file can be created"), std::string::npos);
    ::chmod(locked.c_str(), 0755);
  }
}

}  // namespace trainyard
