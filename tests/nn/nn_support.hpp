// Helpers shared by the nn test files (one translation unit in a unity build).
#pragma once
#include <exception>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace nn_test {

/// Whether e's message contains `what`.
inline bool mentions(const std::exception& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

/// A path in the temporary directory, unique to this process.
inline std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("deft_nn_test_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace nn_test
