// The observability test module: the profiler's Chrome traces and the
// task-graph dumps (see test_profiler.cpp and test_graph_dump.cpp).
#define BOOST_TEST_MODULE deft_observe_tests
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <string>

#include <unistd.h>

// Removes this process's scratch files (support.hpp) when the run ends.
struct RemoveScratch {
  ~RemoveScratch() {
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("deft_observe_" + std::to_string(::getpid())),
                                ignored);
  }
};
BOOST_TEST_GLOBAL_FIXTURE(RemoveScratch);
