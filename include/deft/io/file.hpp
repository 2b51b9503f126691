// Opening a file for reading with an error that says why it cannot be read
// (missing, a directory, no permission), shared by every reader of files;
// writing one atomically, so that a crash leaves the last good copy.
#pragma once
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "../core/error.hpp"

namespace deft::detail {

/// `file` opened for binary reading; std::runtime_error "<who><file>: <why>"
/// where it is missing, a directory or cannot be opened (with the system's
/// reason). A pipe or device opens like a file.
inline std::ifstream open_input(const std::filesystem::path& file, const std::string& who = "") {
  std::error_code ec;
  const auto st = std::filesystem::status(file, ec);
  // status() fails for more than absence: a directory on the way without
  // search permission, a loop of links.
  if (ec && ec != std::errc::no_such_file_or_directory)
    raise<std::runtime_error>(who, file.string(), ": cannot read: ", ec.message());
  if (!std::filesystem::exists(st)) raise<std::runtime_error>(who, file.string(), ": no such file");
  if (std::filesystem::is_directory(st)) raise<std::runtime_error>(who, file.string(), ": is a directory, not a file");
  std::ifstream in(file, std::ios::binary);
  if (!in) raise<std::runtime_error>(who, file.string(), ": cannot open: ", std::strerror(errno));
  return in;
}

/// Writes `file` through write(std::ofstream&) so that it is either the old
/// file or the whole new one, whatever happens meanwhile (a crash, a full
/// disk, an exception from `write`): the bytes go to a temporary file
/// beside it, are flushed to the disk, and the temporary file is then
/// renamed over `file`. std::runtime_error "<who>..." naming what failed;
/// the temporary file is removed then.
template <class Write>
void write_atomically(const std::filesystem::path& file, const std::string& who, Write&& write) {
  std::filesystem::path temporary = file;
  temporary += ".tmp-" + std::to_string(::getpid());
  struct Remove {  // the temporary file, unless renamed
    const std::filesystem::path* path;
    ~Remove() {
      std::error_code ignored;
      if (path) std::filesystem::remove(*path, ignored);
    }
  } cleanup{&temporary};
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) raise<std::runtime_error>(who, "cannot open ", temporary.string(), " for writing: ", std::strerror(errno));
    write(out);
    if (!out.flush()) raise<std::runtime_error>(who, "writing ", temporary.string(), " failed");
  }
  // The data reaches the disk before the rename makes it the file.
  const int fd = ::open(temporary.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    raise<std::runtime_error>(who, "cannot flush ", temporary.string(), " to the disk: ", std::strerror(error));
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(temporary, file, ec);
  if (ec) raise<std::runtime_error>(who, "cannot replace ", file.string(), ": ", ec.message());
  cleanup.path = nullptr;
}

}  // namespace deft::detail
