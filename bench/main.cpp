// deft_bench: deft side by side with Eigen, xtensor, OpenBLAS and libtorch,
// in one process, on the same data, in the spirit of Blaze's blazemark.
//
//   elementwise       fused y = a*b + c*2 - max(d, 0) (2^24 and 4096), STREAM triad
//   broadcast         bias add (row vector), column scale, row-wise softmax
//   reduce            sum of 2^24, sums along each axis of 4096 x 4096
//   gemm              matrix products 512, 2000, 4096 and two MLP shapes
//   record            what one tiny deferred op costs (100,000 of them)
//   sync_vs_deferred  the seeds' 1000 x `y = x + 1` on 2000 x 2000
//   parallel          independent subtrees, all workers over one worker
//
// Every figure is the median (and min) of --repeats timed calls after one
// warm-up (3 repeats for calls over 0.25 s). The last column is deft's
// median divided by this row's: below 1 deft is faster. Every library's
// thread count is set explicitly per row (the `thr` column).
//
// usage: deft_bench [--filter SUBSTRING] [--csv FILE] [--repeats N]
#include <cstdio>
#include <fstream>
#include <string>

#include "common.hpp"

#if DEFT_BENCH_HAVE_EIGEN
#include <Eigen/Core>
#endif
#if DEFT_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if DEFT_BENCH_HAVE_XTENSOR
#include <xtensor/xtensor_config.hpp>
#endif

using namespace bench;

namespace {

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : "n/a";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

void usage() {
  std::fprintf(stderr, "usage: deft_bench [--filter SUBSTRING] [--csv FILE] [--repeats N]\n"
                       "groups: elementwise, broadcast, reduce, gemm, record, sync_vs_deferred, parallel, training\n");
}

/// The targets, checked on this run's medians.
void print_targets() {
  const int all = hardware_threads();
  auto med = [&](const char* g, const std::string& c, const char* lib, int t, const std::string& s) {
    return find_median(g, c, lib, t, s);
  };
  std::printf("\ntargets (medians of this run; ratio = deft time / peer time unless said otherwise)\n");
  auto line = [](const std::string& what, double value, bool ok, const char* fmt = "%.3f") {
    char v[32];
    std::snprintf(v, sizeof v, fmt, value);
    std::printf("  %-66s %10s  %s\n", what.c_str(), v, value < 0 ? "n/a" : ok ? "met" : "NOT met");
  };
  auto ratio = [&](const char* g, const std::string& c, const char* peer, int tp, const std::string& s, int td) {
    const double d = med(g, c, "deft", td, s), p = med(g, c, peer, tp, s);
    return d > 0 && p > 0 ? d / p : -1.0;
  };
  const std::string fused = "fused a*b+c*2-max(d,0)", big = std::to_string(1 << 24);
  if (med("elementwise", fused, "deft", all, big) > 0) {
    double r = ratio("elementwise", fused, "hand-omp", all, big, all);
    line("fused 2^24, all threads: deft / hand OpenMP loop <= 1", r, r <= 1.0);
    r = ratio("elementwise", fused, "eigen-tensor", all, big, all);
    line("fused 2^24, all threads: deft / Eigen Tensor(pool) <= 1/1.1", r, r >= 0 && r <= 1 / 1.1);
    r = ratio("elementwise", fused, "torch", all, big, all);
    line("fused 2^24, all threads: libtorch / deft (info)", r > 0 ? 1 / r : -1, true, "%.2fx");
    // Like for like: ArrayXf runs on one thread, and the two rows are timed in alternation.
    r = ratio("elementwise", fused, "eigen-array", 1, "4096", 1);
    line("fused 4096 through the scheduler, 1 worker: deft / Eigen ArrayXf <= 1.3", r, r >= 0 && r <= 1.3);
    // What the tree's snapshots and moves cost of that: the statement from an expression built once.
    const double pre = med("elementwise", fused, "deft-prebuilt", 1, "4096"), ea = med("elementwise", fused, "eigen-array", 1, "4096");
    line("fused 4096, expression built once: deft / Eigen ArrayXf (info)", pre > 0 && ea > 0 ? pre / ea : -1, true);
  }
  if (med("reduce", "sum all", "deft", all, big) > 0) {
    for (const char* c : {"sum all", "sum axis 0", "sum axis 1"}) {
      const std::string s = std::string(c) == "sum all" ? big : "4096x4096";
      const double r = ratio("reduce", c, "eigen-tensor", all, s, all);
      line(std::string(c) + ": deft / Eigen Tensor(pool) <= 1", r, r >= 0 && r <= 1.0);
    }
  }
  if (med("broadcast", "bias add x+b (row vector)", "deft", all, "1024x2048") > 0) {
    for (const char* c : {"bias add x+b (row vector)", "scale x*s (column)", "softmax rows"})
      for (const char* peer : {"eigen-array", "eigen-tensor"}) {
        const double r = ratio("broadcast", c, peer, peer == std::string("eigen-array") ? 1 : all, "1024x2048", all);
        line(std::string(c) + ": deft / " + peer + " <= 1", r, r >= 0 && r <= 1.0);
      }
  }
  const std::string g2000 = "2000x2000x2000";
  if (med("gemm", "matmul square", "deft", all, g2000) > 0) {
    double r = ratio("gemm", "matmul square", "openblas", all, g2000, all);
    line("matmul 2000, " + std::to_string(all) + " threads: OpenBLAS / deft >= 0.9", r > 0 ? 1 / r : -1, r > 0 && 1 / r >= 0.9);
    r = ratio("gemm", "matmul square", "eigen", all, g2000, all);
    line("matmul 2000: deft / Eigen < 1", r, r >= 0 && r < 1.0);
    const double e = med("gemm", "rel. error vs double", "deft", all, g2000);
    line("matmul 2000: relative error vs double <= 1e-5", e, e >= 0 && e <= 1e-5, "%.2e");
  }
  const double op = med("record", "record+run y=x+1", "deft", deft::engine::num_workers(), "4");
  if (op > 0) {
    line("tiny deferred op, record+run: ns per op <= 500", op, op <= 500, "%.0f");
    const double chain = med("record", "record+run y+=1 (all run)", "deft", deft::engine::num_workers(), "4");
    line("tiny deferred op, every op runs (y += 1): ns per op <= 500", chain, chain <= 500, "%.0f");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string child;  // --peak-memory LIB: the training group's child process
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--filter" || a == "--csv" || a == "--repeats" || a == "--peak-memory") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--filter") opts.filter = v;
      else if (a == "--csv") opts.csv = v;
      else if (a == "--peak-memory") child = v;
      else opts.repeats = std::max(1, std::atoi(v.c_str()));
    } else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (!child.empty()) return training_peak_memory_child(child);
  std::printf("deft_bench: deft %d.%d.%d, %d workers, %s, %d hardware threads\n", DEFT_VERSION_MAJOR,
              DEFT_VERSION_MINOR, DEFT_VERSION_PATCH, deft::engine::num_workers(), cpu_model().c_str(),
              hardware_threads());
  std::printf("peers:");
#if DEFT_BENCH_HAVE_EIGEN
  std::printf(" Eigen %d.%d.%d;", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
#else
  std::printf(" Eigen missing;");
#endif
#if DEFT_BENCH_HAVE_XTENSOR
  std::printf(" xtensor %d.%d.%d;", XTENSOR_VERSION_MAJOR, XTENSOR_VERSION_MINOR, XTENSOR_VERSION_PATCH);
#else
  std::printf(" xtensor missing;");
#endif
#if DEFT_BENCH_HAVE_OPENBLAS
  std::printf(" OpenBLAS (%s);", openblas_get_config());
#else
  std::printf(" OpenBLAS missing;");
#endif
#if DEFT_BENCH_HAVE_TORCH
  std::printf(" libtorch %s;", torch_peer::version().c_str());
#else
  std::printf(" libtorch missing;");
#endif
#if DEFT_BENCH_HAVE_OPENMP
  std::printf(" OpenMP on");
#else
  std::printf(" OpenMP off");
#endif
#if DEFT_BLAS
  std::printf("; deft's matmul routed to cblas (DEFT_BLAS)");
#endif
#if DEFT_BENCH_HAVE_OPENBLAS && (defined(__AVX2__) || defined(__AVX512F__))
  // On a CPU it does not recognise (VMs often), OpenBLAS falls back to its
  // SSE3 kernel: a fifth of its speed, and of libtorch's products through it.
  if (const std::string core = openblas_get_corename(); core == "Prescott" || core == "Core2" || core == "Nehalem")
    std::printf("\nwarning: OpenBLAS runs its generic %s kernel on this AVX2/AVX-512 CPU, so its rows and libtorch's "
                "products understate them: set OPENBLAS_CORETYPE (e.g. SkylakeX, Haswell, Zen) and run again",
                core.c_str());
#endif
  std::printf("\nmedian and min of %d repeats after 1 warm-up (3 for calls over %.2f s); load average before start %s\n",
              opts.repeats, opts.long_call, load_average().c_str());
  print_header();
  if (selected("elementwise")) bench_elementwise();
  if (selected("broadcast")) bench_broadcast();
  if (selected("reduce")) bench_reduce();
  if (selected("gemm")) bench_gemm();
  if (selected("record")) bench_overhead();
  if (selected("sync_vs_deferred")) bench_seeds();
  if (selected("parallel")) bench_parallel();
  if (selected("training")) bench_training();
  if (rows().empty()) {
    std::fprintf(stderr, "deft_bench: no group matches --filter %s\n", opts.filter.c_str());
    usage();
    return 2;
  }
  print_targets();
  std::printf("load average after the run %s\n", load_average().c_str());
  if (!opts.csv.empty()) write_csv(opts.csv);
  return 0;
}
