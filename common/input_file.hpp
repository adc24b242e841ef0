#pragma once
// Reading input files with a size cap checked before parsing: a file far larger than any real one of its kind
// (or a device without end, such as /dev/zero) is refused with its size and the cap instead of filling memory.
#include <cstdint>
#include <string>
#include <string_view>

namespace trainyard {

// Caps per kind. Real files are far smaller: profiles, models and plans are a few KiB, a lengths file of a
// million documents is ~8 MiB. Traces and task graphs become a JSON tree of about 10 bytes per byte of text
// (a 100 MiB trace parsed to 1.0 GB resident), so 128 MiB keeps `compare` and `simulate --graph` under 2 GiB.
inline constexpr std::uint64_t kJsonFileCapBytes = std::uint64_t{64} << 20;
inline constexpr std::uint64_t kGraphFileCapBytes = std::uint64_t{128} << 20;
inline constexpr std::uint64_t kTraceFileCapBytes = std::uint64_t{128} << 20;
inline constexpr std::uint64_t kTextFileCapBytes = std::uint64_t{256} << 20;

// Reads `path` whole. A missing or unreadable path, a directory, or more than `cap_bytes` (a regular file by its
// size before reading; a pipe or device after cap + 1 bytes) is an InputError naming the path; `expected` says
// what the file should be ("a JSON file").
std::string read_input_file(const std::string& path, std::uint64_t cap_bytes, std::string_view expected);

// The checks of read_input_file without keeping the bytes, for a file another part reads itself (run --text).
// Only regular files are accepted: the reader opens the file again, which a pipe or device would not survive.
void check_input_file(const std::string& path, std::uint64_t cap_bytes, std::string_view expected);

// What a non-regular file is, for messages ("a directory", "a character device", ...), from stat's st_mode.
std::string file_kind_name(unsigned mode);

}  // namespace trainyard
