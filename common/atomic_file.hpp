#pragma once
// The one way trainyard writes a file (CLI and GUI): check the path before any work, then write a uniquely named
// temporary file in the same folder, fsync it, close it and rename it over the target. A failed write (disk full,
// I/O error, an exception while producing the bytes) removes the temporary file and leaves the target untouched.
//
// Only regular files are written. A device, pipe or socket (e.g. /dev/full, /dev/null, /dev/stdout in a pipe) is
// refused up front: renaming into place would replace the device node instead of writing to it, and a write
// straight to it could be neither atomic nor checked the same way. A symbolic link is followed: its target is
// replaced, the link stays.
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace trainyard {

// Refuses, with an InputError naming `flag` (e.g. "--out") and the path: an empty path, a directory, a target that
// is not a regular file, a read-only file, a folder that does not exist, and a folder where no file can be
// created (tested by creating and removing a probe file). Call it before the work whose result goes there.
void check_writable(const std::string& path, const std::string& flag);

// Writes `path` atomically with what `write` puts on the stream (streamed to disk, not held in memory).
// Failures are InputErrors naming the path and the system's reason.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);
// The same for bytes already in memory.
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace trainyard
