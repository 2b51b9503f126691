// deft_fuzz: differential fuzzing of deft against a double-precision reference.
//
//   deft_fuzz [--programs N] [--seed S]   run N seeded programs (default 20000,
//                                         or $DEFT_FUZZ_PROGRAMS), seeds S, S+1, ...
//   deft_fuzz --replay SEED               print one program as C++ and run it
//   deft_fuzz --seeds-file FILE           run the seeds listed in FILE (regressions)
//   --no-shrink                           report a failing seed without shrinking it
//
// A failing program prints its seed, the mismatch, and a shrunk reproducer
// (C++ using deft's public API); the exit status is then 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "deft_runner.hpp"
#include "generator.hpp"
#include "shrink.hpp"

namespace {

fz::Program generate(std::uint64_t seed) {
  fz::SeededSource src(seed);
  return fz::Generator(src).program(seed);
}

/// Reports a failing program: the seed, the mismatch, then the shrunk reproducer.
void report(const fz::Program& p, const fz::Result& r, bool do_shrink) {
  std::cout << "\nFAIL: seed " << p.seed << ": " << r.message << "\n";
  std::cout << "replay with: deft_fuzz --replay " << p.seed << "\n";
  fz::Program small = p;
  if (do_shrink) {
    std::cout << "shrinking..." << std::endl;
    fz::Counters scratch;
    small = fz::shrink(p, [&](const fz::Program& q) { return fz::run_program(q, scratch).status == fz::Result::mismatch; });
  }
  fz::Counters scratch;
  std::ostringstream code;
  const fz::Result again = fz::run_program(small, scratch, &code);
  std::cout << "minimal reproducer (" << small.stmts.size() << " statements; "
            << (again.status == fz::Result::mismatch ? again.message : std::string("did not fail again: flaky")) << "):\n"
            << code.str() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t programs = 20000;
  if (const char* e = std::getenv("DEFT_FUZZ_PROGRAMS")) programs = std::atoll(e);
  std::uint64_t seed = 1;
  bool do_shrink = true;
  std::vector<std::uint64_t> seeds;
  bool seeds_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--programs") programs = std::stoll(value());
    else if (a == "--seed") seed = std::stoull(value());
    else if (a == "--no-shrink") do_shrink = false;
    else if (a == "--replay") {
      const fz::Program p = generate(std::stoull(value()));
      fz::Counters c;
      std::ostringstream code;
      const fz::Result r = fz::run_program(p, c, &code);
      std::cout << code.str();
      std::cout << "// result: "
                << (r.status == fz::Result::ok ? "ok" : r.status == fz::Result::invalid ? "invalid program: " : "MISMATCH: ")
                << r.message << "\n";
      if (r.status != fz::Result::ok) report(p, r, do_shrink);
      return r.status == fz::Result::ok ? 0 : 1;
    } else if (a == "--seeds-file") {
      seeds_file = true;
      std::ifstream f(value());
      if (!f) {
        std::cerr << "cannot read the seeds file\n";
        return 2;
      }
      for (std::string line; std::getline(f, line);) {
        const auto h = line.find('#');
        if (h != std::string::npos) line.resize(h);
        std::istringstream is(line);
        std::uint64_t s;
        if (is >> s) seeds.push_back(s);
      }
    } else {
      std::cerr << "usage: deft_fuzz [--programs N] [--seed S] [--replay SEED] [--seeds-file FILE] [--no-shrink]\n";
      return 2;
    }
  }
  if (!seeds_file)
    for (std::int64_t i = 0; i < programs; ++i) seeds.push_back(seed + std::uint64_t(i));

  fz::Counters c;
  const auto t0 = std::chrono::steady_clock::now();
  int failures = 0;
  for (std::uint64_t s : seeds) {
    const fz::Program p = generate(s);
    const fz::Result r = fz::run_program(p, c);
    if (r.status == fz::Result::mismatch) {
      ++failures;
      report(p, r, do_shrink);
      break;
    }
    if (r.status == fz::Result::invalid) {
      ++failures;  // the generator made a program the reference refuses: a bug in the fuzzer
      std::cout << "generator bug: seed " << s << " is not a valid program: " << r.message << "\n";
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "deft_fuzz: %lld programs, %lld statements, %lld sync points checked, %lld elements compared, "
      "%lld skipped as unknown, %lld invalid statements refused, %.1f s (%.0f programs/s)%s\n",
      (long long)c.programs, (long long)c.statements, (long long)c.syncs, (long long)c.compared, (long long)c.skipped,
      (long long)c.invalid_checked, secs, double(c.programs) / secs, failures ? ", FAILED" : "");
  return failures ? 1 : 0;
}
