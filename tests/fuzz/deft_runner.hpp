// Runs a program on deft and, statement by statement, on the reference
// interpreter; compares deft's values with the reference at every sync point
// and every live slot at the end. Optionally writes the deft calls it makes
// as a C++ program (the reproducer).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "program.hpp"

namespace fz {

struct Counters {
  std::int64_t programs = 0, statements = 0, syncs = 0, compared = 0, skipped = 0;
  std::int64_t invalid_checked = 0;   // deliberate mistakes deft refused as it should
  std::int64_t invalid_programs = 0;  // programs the reference found invalid (a generator bug if nonzero in CI)
};

struct Result {
  enum Status { ok, mismatch, invalid } status = ok;
  std::string message;
};

/// Runs `p` (setting the engine's mode and worker count first). `code`, when
/// given, receives the program as C++ using deft's public API.
Result run_program(const Program& p, Counters& c, std::ostream* code = nullptr);

/// A float as a C++ literal ("1.5f", "-inf", "nan").
std::string float_literal(float v);

}  // namespace fz
