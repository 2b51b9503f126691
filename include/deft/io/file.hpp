// Opening a file for reading with an error that says why it cannot be read
// (missing, a directory, no permission), shared by every reader of files.
#pragma once
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

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

}  // namespace deft::detail
