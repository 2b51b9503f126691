// Helpers for the observability tests: scratch files and reading them back.
#pragma once
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <deft/deft.hpp>
#include <deft/engine/graph_dump.hpp>

namespace obs {

/// A fresh path in a per-process scratch directory (removed by nobody: CTest's tmp is throwaway).
inline std::string scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("deft_observe_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto p = dir / name;
  std::filesystem::remove(p);
  return p.string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

/// Starts each test with no recorded work, no running trace and zeroed counters.
struct Clean {
  Clean() {
    try {
      deft::wait_all();
    } catch (...) {
    }
    if (deft::engine::tracing()) deft::engine::trace_stop();
    deft::engine::reset_stats();
  }
};

/// Checks that `what` throws std::runtime_error whose message names `path`.
#define OBS_REQUIRE_ERROR_NAMING(statement, path)                                               \
  do {                                                                                          \
    bool thrown = false;                                                                        \
    try {                                                                                       \
      statement;                                                                                \
    } catch (const std::runtime_error& e) {                                                     \
      thrown = true;                                                                            \
      BOOST_TEST_MESSAGE("message: " << e.what());                                              \
      BOOST_TEST(std::string(e.what()).find("'" + std::string(path) + "'") != std::string::npos); \
    }                                                                                           \
    BOOST_TEST(thrown, #statement " did not throw std::runtime_error");                         \
  } while (0)

}  // namespace obs
