#include "common/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/units.hpp"

namespace trainyard {

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& why, std::string_view expected) {
  throw InputError(path + ": " + why + " (expected " + std::string(expected) + ")");
}

std::string cap_words(std::uint64_t cap_bytes) { return "the cap of " + format_bytes(static_cast<double>(cap_bytes)) + " for this kind of file"; }

// Closes on every way out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens for reading without blocking on a FIFO that has no writer (a read then sees end of file at once).
int open_for_reading(const std::string& path, std::string_view expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) refuse(path, std::string("cannot open it: ") + std::strerror(errno), expected);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// The size of a regular file, checked against the cap; nullopt-like -1 for pipes and devices (no size to trust).
std::int64_t checked_size(int fd, const std::string& path, std::uint64_t cap_bytes, std::string_view expected) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) refuse(path, std::string("cannot read it: ") + std::strerror(errno), expected);
  if (S_ISDIR(st.st_mode)) refuse(path, "is a directory", expected);
  if (!S_ISREG(st.st_mode)) return -1;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > cap_bytes) {
    refuse(path, "its size, " + std::to_string(size) + " bytes (" + format_bytes(static_cast<double>(size)) + "), is over " + cap_words(cap_bytes),
           expected);
  }
  return static_cast<std::int64_t>(size);
}

}  // namespace

std::string read_input_file(const std::string& path, std::uint64_t cap_bytes, std::string_view expected) {
  Fd file{open_for_reading(path, expected)};
  const std::int64_t size = checked_size(file.fd, path, cap_bytes, expected);
  std::string text;
  if (size >= 0) text.reserve(static_cast<std::size_t>(size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(path, std::string("reading it failed: ") + std::strerror(errno), expected);
    if (n == 0) break;
    // A regular file may grow while read; a pipe or device has no size: the cap holds for both.
    if (text.size() + static_cast<std::size_t>(n) > cap_bytes) {
      refuse(path,
             "more than " + format_bytes(static_cast<double>(cap_bytes)) + " read (" +
                 (size >= 0 ? std::string("it grew while read") : std::string("a device or pipe without end?")) + "), over " + cap_words(cap_bytes),
             expected);
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

void check_input_file(const std::string& path, std::uint64_t cap_bytes, std::string_view expected) {
  Fd file{open_for_reading(path, expected)};
  if (checked_size(file.fd, path, cap_bytes, expected) < 0) {
    struct stat st {};
    ::fstat(file.fd, &st);
    refuse(path, "is " + file_kind_name(st.st_mode) + ", not a regular file", expected);
  }
}

std::string file_kind_name(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace trainyard
