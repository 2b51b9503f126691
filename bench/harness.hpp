// deft_bench's harness: timing (warm-up, repeats, median and min), the rows
// of the table with the ratio deft/peer, the CSV writer, aligned buffers and
// the thread-count switches of every library. Knows nothing about deft.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace bench {

struct Options {
  std::string filter;   // groups whose name contains this (empty: all)
  std::string csv;      // also write the rows here
  int repeats = 7;      // timed repeats after one warm-up
  double long_call = 0.25;  // seconds: calls longer than this get at most 3 repeats
};
extern Options opts;

struct Summary {
  double median, min;  // seconds
};

/// One warm-up call of f, then opts.repeats timed calls (3 when a call takes
/// longer than opts.long_call seconds); seconds per call.
Summary measure(const std::function<void()>& f);
/// Like measure, but times only `timed` and runs `untimed` after each call.
Summary measure_split(const std::function<void()>& timed, const std::function<void()>& untimed);
/// measure() for several calls in alternation: one warm-up of each, then
/// opts.repeats rounds that time each call once in turn. For rows whose ratio
/// matters: the VM's slow phases last seconds, longer than a row of small
/// calls, and would otherwise fall on one library's row and not the next.
/// With `calls` > 1 each sample is that many calls in a row (seconds per
/// call), after `settle` and one untimed call: for thread pools, so that
/// each runs as it does back to back, its threads awake. `settle` can stop
/// the other pool's threads (OpenMP's spin for milliseconds after a loop).
std::vector<Summary> measure_interleaved(const std::vector<std::function<void()>>& fs, int calls = 1,
                                         const std::function<void()>& settle = {});
/// Puts OpenMP's threads to sleep (omp_pause_resource_all) where the bench
/// has OpenMP: they spin after a loop, with OMP_WAIT_POLICY unset, on the
/// cores the next library's threads need.
void pause_omp_threads();

struct Row {
  std::string group, name, library;
  int threads;
  std::string size, unit;
  double median, min;
};
const std::vector<Row>& rows();

/// Adds a row and prints it. For time units (s, ms, us, ns/op) the last
/// column is deft's median over this row's (same group, case, size, and
/// threads when deft has a row with that count, else deft's row with the most
/// threads): below 1 deft is faster.
void add(const std::string& group, const std::string& name, const std::string& library, int threads,
         const std::string& size, const std::string& unit, double median, double min);
/// A time row from a Summary in seconds, scaled to `unit` (ms, us, ns/op with `per` operations).
void add_time(const std::string& group, const std::string& name, const std::string& library, int threads,
              const std::string& size, const std::string& unit, const Summary& s, double per = 1);
/// Prints a line saying why rows are missing (once per library and group).
void skip(const std::string& group, const std::string& library, const std::string& why);

void print_header();
void write_csv(const std::string& path);
bool selected(const char* group);
/// deft's median for a case (threads < 0: the most threads), or -1.
double find_median(const std::string& group, const std::string& name, const std::string& library, int threads,
                   const std::string& size);

/// Keeps the compiler from dropping a loop whose result is unused.
inline void clobber(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

/// 64-byte aligned float storage (peers read the same values deft holds).
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
struct FloatBuf {
  std::unique_ptr<float[], AlignedFree> p;
  std::size_t n = 0;
  FloatBuf() = default;
  explicit FloatBuf(std::size_t count) : n(count) {
    void* q = std::aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64);
    if (!q) throw std::bad_alloc();
    p.reset(static_cast<float*>(q));
  }
  FloatBuf(const std::vector<float>& v) : FloatBuf(v.size()) {
    for (std::size_t i = 0; i < n; ++i) p[i] = v[i];
  }
  float* data() { return p.get(); }
  const float* data() const { return p.get(); }
  std::size_t size() const { return n; }
};

// --- child processes -----------------------------------------------------
/// Runs `command` and returns the number after `key` (e.g. "peak_mib ") at
/// the start of a line of its output; -1 if none, or if the command failed.
double child_number(const std::string& command, const char* key);

// --- threads of every library -------------------------------------------
int hardware_threads();
/// OpenMP (hand-written loops, Eigen's matrix product).
void set_omp_threads(int n);
/// OpenBLAS's own pool (openblas_set_num_threads).
void set_blas_threads(int n);
/// Eigen's matrix product (Eigen::setNbThreads, OpenMP underneath).
void set_eigen_threads(int n);

}  // namespace bench
