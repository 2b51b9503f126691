#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#if DEFT_BENCH_HAVE_OPENMP
#include <omp.h>
#endif
#if DEFT_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if DEFT_BENCH_HAVE_EIGEN
#include <Eigen/Core>
#endif

namespace bench {

Options opts;

namespace {
std::vector<Row> g_rows;
using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Summary summarise(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

bool is_time(const std::string& unit) { return unit == "s" || unit == "ms" || unit == "us" || unit == "ns/op"; }
}  // namespace

const std::vector<Row>& rows() { return g_rows; }

Summary measure(const std::function<void()>& f) { return measure_split(f, [] {}); }

Summary measure_split(const std::function<void()>& timed, const std::function<void()>& untimed) {
  const double warm = seconds_of(timed);
  untimed();
  const int repeats = warm > opts.long_call ? std::min(opts.repeats, 3) : opts.repeats;
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    t.push_back(seconds_of(timed));
    untimed();
  }
  return summarise(t);
}

std::vector<Summary> measure_interleaved(const std::vector<std::function<void()>>& fs, int calls,
                                         const std::function<void()>& settle) {
  for (const auto& f : fs) f();
  std::vector<std::vector<double>> t(fs.size());
  const auto block = [&](const std::function<void()>& f) {
    for (int c = 0; c < calls; ++c) f();
  };
  for (int r = 0; r < opts.repeats; ++r)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      if (calls == 1) {
        t[i].push_back(seconds_of(fs[i]));
        continue;
      }
      if (settle) settle();
      fs[i]();
      t[i].push_back(seconds_of([&] { block(fs[i]); }) / calls);
    }
  std::vector<Summary> out;
  for (auto& ti : t) out.push_back(summarise(std::move(ti)));
  return out;
}

double find_median(const std::string& group, const std::string& name, const std::string& library, int threads,
                   const std::string& size) {
  const Row* best = nullptr;
  for (const auto& r : g_rows) {
    if (r.group != group || r.name != name || r.library != library || r.size != size) continue;
    if (threads >= 0 && r.threads == threads) return r.median;
    if (threads < 0 && (!best || r.threads > best->threads)) best = &r;
  }
  return best ? best->median : -1;
}

void add(const std::string& group, const std::string& name, const std::string& library, int threads,
         const std::string& size, const std::string& unit, double median, double min) {
  g_rows.push_back({group, name, library, threads, size, unit, median, min});
  char ratio[32] = "";
  if (library != "deft" && is_time(unit)) {
    double d = find_median(group, name, "deft", threads, size);
    if (d < 0) d = find_median(group, name, "deft", -1, size);
    if (d > 0 && median > 0) std::snprintf(ratio, sizeof ratio, "%9.2f", d / median);
  }
  std::printf("%-12s %-34s %-13s %3d %-15s %-7s %11.4g %11.4g %9s\n", group.c_str(), name.c_str(), library.c_str(),
              threads, size.c_str(), unit.c_str(), median, min, ratio);
  std::fflush(stdout);
}

void add_time(const std::string& group, const std::string& name, const std::string& library, int threads,
              const std::string& size, const std::string& unit, const Summary& s, double per) {
  const double scale = unit == "s" ? 1 : unit == "ms" ? 1e3 : unit == "us" ? 1e6 : 1e9;
  add(group, name, library, threads, size, unit, s.median * scale / per, s.min * scale / per);
}

void skip(const std::string& group, const std::string& library, const std::string& why) {
  static std::set<std::string> said;
  if (!said.insert(group + "/" + library).second) return;
  std::printf("%-12s (%s rows skipped: %s)\n", group.c_str(), library.c_str(), why.c_str());
}

void print_header() {
  std::printf("%-12s %-34s %-13s %3s %-15s %-7s %11s %11s %9s\n", "group", "case", "library", "thr", "size", "unit",
              "median", "min", "deft/peer");
}

void write_csv(const std::string& path) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "deft_bench: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  // RFC 4180: the text fields are quoted, their quotes doubled (a size may
  // hold a comma, a case name a quote).
  const auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + '"';
  };
  out << "group,case,library,threads,size,unit,median,min\n";
  for (const auto& r : g_rows)
    out << r.group << ',' << quoted(r.name) << ',' << r.library << ',' << r.threads << ',' << quoted(r.size) << ','
        << r.unit << ',' << r.median << ',' << r.min << '\n';
}

bool selected(const char* group) { return opts.filter.empty() || std::strstr(group, opts.filter.c_str()); }

double child_number(const std::string& command, const char* key) {
  FILE* p = popen(command.c_str(), "r");
  if (!p) return -1;
  const std::size_t k = std::strlen(key);
  char line[256];
  double v = -1;
  while (std::fgets(line, sizeof line, p))
    if (std::strncmp(line, key, k) == 0) v = std::atof(line + k);
  return pclose(p) == 0 ? v : -1;
}

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

void pause_omp_threads() {
#if DEFT_BENCH_HAVE_OPENMP
  omp_pause_resource_all(omp_pause_soft);
#endif
}

void set_omp_threads([[maybe_unused]] int n) {
#if DEFT_BENCH_HAVE_OPENMP
  omp_set_num_threads(n);
#endif
}
void set_blas_threads([[maybe_unused]] int n) {
#if DEFT_BENCH_HAVE_OPENBLAS
  openblas_set_num_threads(n);
#endif
}
void set_eigen_threads([[maybe_unused]] int n) {
#if DEFT_BENCH_HAVE_EIGEN
  Eigen::setNbThreads(n);
#endif
}

}  // namespace bench
