#include "common/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <streambuf>

#include "common/error.hpp"
#include "common/input_file.hpp"

namespace fs = std::filesystem;

namespace trainyard {

namespace {

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

// The file a path names: a symbolic link is followed to its target (so the link stays a link). Empty `why`
// means usable so far; otherwise it says what is wrong.
struct Target {
  std::string path;
  std::string why;
  bool exists = false;
  mode_t mode = 0;
};

Target resolve(const std::string& path) {
  Target t{path, "", false, 0};
  if (path.empty()) {
    t.why = "is empty";
    return t;
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const fs::path real = fs::canonical(path, ec);
    if (ec) {
      t.why = "is a symbolic link to a missing file";
      return t;
    }
    t.path = real.string();
  }
  if (::stat(t.path.c_str(), &st) != 0) return t;  // a new file
  t.exists = true;
  t.mode = st.st_mode;
  if (S_ISDIR(st.st_mode)) t.why = "is a directory";
  else if (!S_ISREG(st.st_mode))
    t.why = "is " + file_kind_name(st.st_mode) + ", not a regular file (trainyard writes files by renaming a finished temporary file into place)";
  return t;
}

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A new, uniquely named file beside `path`: "<path>.<random>.tmp". Removed on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& path) : target_(path) {
    thread_local std::mt19937_64 rng(std::random_device{}() ^
                                     static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                                     static_cast<std::uint64_t>(::getpid()));
    static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::string suffix;
      for (int i = 0; i < 8; ++i) suffix += kLetters[rng() % (sizeof kLetters - 1)];
      name_ = path + "." + suffix + ".tmp";
      fd_ = ::open(name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // the umask applies
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0) error_ = errno;
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !name_.empty() && error_ == 0) ::unlink(name_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  int open_error() const { return error_; }
  // fsync, close (its error counts: NFS reports late write errors there), rename over the target.
  void commit() {
    if (::fsync(fd_) != 0) fail_with_errno("saving it to disk (fsync) failed");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail_with_errno("closing it failed");
    if (::rename(name_.c_str(), target_.c_str()) != 0) fail_with_errno("moving the finished file into place failed");
    committed_ = true;
    const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {  // makes the rename itself durable; a failure here loses nothing already written
      ::fsync(dir);
      ::close(dir);
    }
  }
  [[noreturn]] void fail_with_errno(const char* what) const { fail(what, errno); }
  [[noreturn]] void fail(const char* what, int error) const {
    throw InputError(target_ + ": " + what + ": " + std::strerror(error) + "; the file was not written");
  }

 private:
  std::string target_, name_;
  int fd_ = -1;
  int error_ = 0;
  bool committed_ = false;
};

// Writes all of [data, data + size), retrying short writes; false with errno set on failure.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// An ostream buffer over a file descriptor that remembers the first write error (std::ofstream forgets errno).
class FdBuffer : public std::streambuf {
 public:
  explicit FdBuffer(int fd) : fd_(fd) { setp(buffer_, buffer_ + sizeof buffer_); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    if (error_ != 0) return false;
    const auto pending = static_cast<std::size_t>(pptr() - pbase());
    if (pending > 0 && !write_all(fd_, pbase(), pending)) {
      error_ = errno;
      return false;
    }
    setp(buffer_, buffer_ + sizeof buffer_);
    return true;
  }

  int fd_;
  int error_ = 0;
  char buffer_[1 << 16];
};

// Opens the temporary file for `path`, refusing what check_writable refuses.
TempFile& open_temp(const Target& t, const std::string& path, std::optional<TempFile>& slot) {
  if (!t.why.empty()) throw InputError(quoted(path) + ": cannot write it: it " + t.why);
  slot.emplace(t.path);
  if (slot->fd() < 0) {
    throw InputError(path + ": cannot create a file in " + quoted(folder_of(t.path)) + ": " + std::strerror(slot->open_error()));
  }
  // Keep an existing file's permissions.
  if (t.exists) ::fchmod(slot->fd(), t.mode & 07777);
  return *slot;
}

}  // namespace

void check_writable(const std::string& path, const std::string& flag) {
  const auto refuse = [&](const std::string& got) { throw InputError(flag, "value", "a path to a file trainyard can write", got); };
  const Target t = resolve(path);
  if (!t.why.empty()) refuse(quoted(path) + ", which " + t.why);
  const std::string folder = folder_of(t.path);
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) refuse(quoted(path) + ", whose folder " + quoted(folder) + " does not exist");
  if (!S_ISDIR(st.st_mode)) refuse(quoted(path) + ": " + quoted(folder) + " is not a folder");
  if (t.exists && ::access(t.path.c_str(), W_OK) != 0) refuse(quoted(path) + ", which is read-only (" + std::strerror(errno) + ")");
  std::optional<TempFile> probe;
  probe.emplace(t.path);
  if (probe->fd() < 0) {
    refuse(quoted(path) + ": no file can be created in " + quoted(folder) + " (" + std::strerror(probe->open_error()) + ")");
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  std::optional<TempFile> slot;
  TempFile& temp = open_temp(resolve(path), path, slot);
  FdBuffer buffer(temp.fd());
  std::ostream out(&buffer);
  write(out);
  out.flush();
  if (!out || buffer.error() != 0) temp.fail("writing it failed", buffer.error() != 0 ? buffer.error() : EIO);
  temp.commit();
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  std::optional<TempFile> slot;
  TempFile& temp = open_temp(resolve(path), path, slot);
  if (!write_all(temp.fd(), bytes.data(), bytes.size())) temp.fail_with_errno("writing it failed");
  temp.commit();
}

}  // namespace trainyard
